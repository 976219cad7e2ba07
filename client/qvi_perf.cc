// qvi-perf: an asynchronous load generator for qvi-server (and, for comparison, for any server
// speaking qvi.serving.v1.Inference, or a TorchServe-style HTTP endpoint).
//
//   qvi-perf --server localhost:8500 --model sentiment --concurrency 1,4,16,64 --duration 10
//   qvi-perf --server localhost:8500 --model sentiment --rate 200,400 --metrics http://localhost:8502/metrics
//   qvi-perf --http http://localhost:8080/predictions/sentiment --concurrency 1,8
//   qvi-perf --server localhost:8500 --protocol oip --model sentiment --concurrency 1,16
//   qvi-perf --server localhost:8500 --protocol stream --model sentiment --concurrency 1,16  (perf_stream.h)
//
// Closed loop (--concurrency): N calls in flight, each completion sends the next. Open loop
// (--rate): calls leave on a fixed schedule whatever the server does, and latency is measured
// from each call's scheduled time, so a slow server cannot hide its queueing (no coordinated
// omission). Each step warms up, then measures for --duration seconds. With --metrics, the
// server's own Prometheus counters are read before and after the step, giving its mean queue
// wait, batch compute time and batch size over the same window, and its CPU time
// (process_cpu_seconds_total): each row shows the CPU microseconds per request of this process and of
// the server, so a run shows whether the generator or the server was the limit, and the server's
// voluntary context switches per request (qvi_process_context_switches_total: its thread hand-offs). Calls are spread
// over --channels connections and their answers taken by --threads completion-queue threads.
// --protocol oip sends the same texts as Open Inference Protocol ModelInfer calls (a BYTES tensor,
// raw contents, the default outputs; --attention / --gates as request parameters), so the cost of
// that path can be set beside the native one.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/channel.h"
#include "client/load_texts.h"
#include "client/perf_step.h"
#include "client/perf_stream.h"
#include "inference/open_inference_grpc.grpc.pb.h"
#include "qvi/serving/v1/inference.grpc.pb.h"

namespace v1 = qvi::serving::v1;
using namespace qvi::perf;  // NOLINT(build/namespaces): Step, Recorder and their helpers (perf_step.h)

namespace {

struct Options {
  std::string server = "localhost:8500";
  qvi::TlsClientOptions tls;
  std::string api_key;  // sent as `authorization: Bearer KEY` with every call (--api-key, QVI_API_KEY)
  std::string http;     // a TorchServe-style endpoint instead: POST one text, any 200 answer counts
  // The body of each POST: "text" (the text itself, TorchServe's API) or "json" (qvi-server's
  // HTTP/JSON route: {"texts": [the text]}, with --attention / --gates in its options).
  std::string http_body = "text";
  std::string model = "sentiment";
  std::string method = "classify";
  std::string protocol = "native";  // or "oip": ModelInfer of the Open Inference Protocol
  std::vector<int> concurrency;
  std::vector<double> rates;
  double duration = 10;
  double warmup = 2;
  int texts_per_request = 1;
  std::string texts_file;
  int pool = 1000;
  double words = 20, words_stddev = 5;
  uint32_t seed = 1;
  bool attention = false, gates = false;
  int faithfulness_top_k = 0;  // Classify: options.faithfulness.top_k
  bool contributions = false;  // Classify: options.contributions
  bool occlusion = false;      // options.occlusion: each text again without each of its tokens
  int channels = 4;            // connections: one HTTP/2 connection serialises its streams' frames
  int threads = 2;             // completion-queue threads that take answers and send the next calls
  std::string metrics;
  std::string json;
  std::string label;  // names the system in the JSON (the benchmark harness sets it)
};

// What a gRPC loop has going (chains or calls); Wait() returns once the last has ended.
class InFlight {
 public:
  explicit InFlight(int64_t n = 0) : n_(n) {}
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t n_;
};

// The qvi.serving.v1 target: asynchronous calls on --channels connections, their answers taken by
// --threads threads, each polling a completion queue of its own (the layout of gRPC's own benchmark
// client). A call's `done` runs on its queue's thread and may send the next call from there.
class GrpcTarget {
 public:
  GrpcTarget(const Options& o, const std::vector<std::string>& texts) : o_(o) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    for (int i = 0; i < o.channels; ++i) {
      args.SetInt("qvi-perf-channel", i);  // distinct arguments: a connection of its own
      std::shared_ptr<grpc::Channel> channel = qvi::MakeChannel(o.server, o.tls, args);
      channels_.push_back(channel);
      stubs_.push_back(v1::Inference::NewStub(channel));
      oip_stubs_.push_back(inference::GRPCInferenceService::NewStub(channel));
    }
    for (size_t i = 0; i + o.texts_per_request <= texts.size(); i += o.texts_per_request) {
      v1::ClassifyRequest c;
      v1::TagRequest t;
      c.mutable_model()->set_name(o.model);
      t.mutable_model()->set_name(o.model);
      for (int k = 0; k < o.texts_per_request; ++k) {
        c.add_texts(texts[i + k]);
        t.add_texts(texts[i + k]);
      }
      c.mutable_options()->set_attention(o.attention);
      c.mutable_options()->set_gates(o.gates);
      if (o.faithfulness_top_k > 0) c.mutable_options()->mutable_faithfulness()->set_top_k(o.faithfulness_top_k);
      c.mutable_options()->set_contributions(o.contributions);
      c.mutable_options()->set_occlusion(o.occlusion);
      t.mutable_options()->set_attention(o.attention);
      t.mutable_options()->set_gates(o.gates);
      t.mutable_options()->set_occlusion(o.occlusion);
      classify_.push_back(std::move(c));
      tag_.push_back(std::move(t));
      // The same texts as one ModelInfer call: a BYTES tensor [N] in raw contents (4-byte length, bytes).
      inference::ModelInferRequest m;
      m.set_model_name(o.model);
      auto* input = m.add_inputs();
      input->set_name("text");
      input->set_datatype("BYTES");
      input->add_shape(o.texts_per_request);
      std::string& raw = *m.add_raw_input_contents();
      for (int k = 0; k < o.texts_per_request; ++k) {
        const std::string& text = texts[i + k];
        const uint32_t n = static_cast<uint32_t>(text.size());
        for (int b = 0; b < 4; ++b) raw.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
        raw += text;
      }
      if (o.attention) (*m.mutable_parameters())["attention"].set_bool_param(true);
      if (o.gates) (*m.mutable_parameters())["gates"].set_bool_param(true);
      if (o.contributions) (*m.mutable_parameters())["contributions"].set_bool_param(true);
      if (o.occlusion) (*m.mutable_parameters())["occlusion"].set_bool_param(true);
      infer_.push_back(std::move(m));
    }
    for (int i = 0; i < o.threads; ++i) {
      queues_.push_back(std::make_unique<grpc::CompletionQueue>());
      grpc::CompletionQueue* cq = queues_.back().get();
      pollers_.emplace_back([cq] {
        void* tag = nullptr;
        bool ok = false;
        while (cq->Next(&tag, &ok)) {
          auto* call = static_cast<Call*>(tag);
          call->done(call->status.ok() ? "" : CodeName(call->status.error_code()));
          delete call;
        }
      });
    }
  }

  ~GrpcTarget() {
    for (auto& cq : queues_) cq->Shutdown();
    for (std::thread& t : pollers_) t.join();
  }

  // Sends one call; `done(error)` runs once, on a completion-queue thread ("" for OK).
  void Send(std::function<void(const std::string&)> done) {
    const uint64_t n = next_.fetch_add(1);
    auto* call = new Call;
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!o_.api_key.empty()) call->ctx.AddMetadata("authorization", "Bearer " + o_.api_key);
    call->done = std::move(done);
    v1::Inference::Stub& stub = *stubs_[n % stubs_.size()];
    grpc::CompletionQueue* cq = queues_[(n / stubs_.size()) % queues_.size()].get();
    if (o_.protocol == "oip") {
      inference::GRPCInferenceService::Stub& oip = *oip_stubs_[n % oip_stubs_.size()];
      call->infer_reader = oip.AsyncModelInfer(&call->ctx, infer_[n % infer_.size()], cq);
      call->infer_reader->Finish(&call->infer, &call->status, call);
    } else if (o_.method == "tag") {
      call->tag_reader = stub.AsyncTag(&call->ctx, tag_[n % tag_.size()], cq);
      call->tag_reader->Finish(&call->tag, &call->status, call);
    } else {
      call->classify_reader = stub.AsyncClassify(&call->ctx, classify_[n % classify_.size()], cq);
      call->classify_reader->Finish(&call->classify, &call->status, call);
    }
  }

  // The same requests, as --protocol stream sends them (perf_stream.h).
  StreamLoad Streams() const { return {channels_, &classify_, &tag_, o_.method == "tag", o_.api_key}; }

  // gRPC's codes are Abseil's, number for number; Abseil names them.
  static std::string CodeName(grpc::StatusCode c) { return absl::StatusCodeToString(static_cast<absl::StatusCode>(c)); }

 private:
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    v1::ClassifyResponse classify;
    v1::TagResponse tag;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::ClassifyResponse>> classify_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::TagResponse>> tag_reader;
    inference::ModelInferResponse infer;
    std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> infer_reader;
    std::function<void(const std::string&)> done;
  };
  const Options& o_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs_;
  std::vector<std::unique_ptr<inference::GRPCInferenceService::Stub>> oip_stubs_;
  std::vector<v1::ClassifyRequest> classify_;
  std::vector<v1::TagRequest> tag_;
  std::vector<inference::ModelInferRequest> infer_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> pollers_;
  std::atomic<uint64_t> next_{0};
};

// Closed loop over gRPC: `concurrency` chains of calls until the window ends. The chains' state is
// shared with the callbacks, so the last callback can return after the caller has moved on.
Step ClosedLoopGrpc(GrpcTarget& target, int concurrency, double warmup, double duration) {
  struct Loop {
    Loop(Clock::time_point start, Clock::time_point end, int chains) : end(end), rec(start, end), running(chains) {}
    const Clock::time_point end;
    Recorder rec;
    InFlight running;  // chains
  };
  const auto start = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  auto loop = std::make_shared<Loop>(
      start, start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration)), concurrency);
  struct Chain {
    static void Next(GrpcTarget& target, std::shared_ptr<Loop> loop) {
      const auto sent = Clock::now();
      if (sent >= loop->end) {
        loop->running.Done();
        return;
      }
      target.Send([&target, loop, sent](const std::string& error) {
        loop->rec.Record(sent, Clock::now(), error);
        Next(target, loop);
      });
    }
  };
  for (int i = 0; i < concurrency; ++i) Chain::Next(target, loop);
  loop->running.Wait();
  return loop->rec.Take("closed", concurrency, duration);
}

// Open loop over gRPC: calls leave every 1/rate seconds; latency counts from the scheduled time.
Step OpenLoopGrpc(GrpcTarget& target, double rate, double warmup, double duration) {
  struct Loop {
    Loop(Clock::time_point start, Clock::time_point end) : rec(start, end, /*by_schedule=*/true) {}
    Recorder rec;
    InFlight outstanding;  // calls
  };
  const auto t0 = Clock::now();
  const auto start = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
  auto loop = std::make_shared<Loop>(start, end);
  const auto interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
  for (auto due = t0; due < end; due += interval) {
    std::this_thread::sleep_until(due);
    loop->outstanding.Add();
    target.Send([loop, due](const std::string& error) {
      loop->rec.Record(due, Clock::now(), error);
      loop->outstanding.Done();
    });
  }
  loop->outstanding.Wait();
  return loop->rec.Take("open", rate, duration);
}

// Closed loop over HTTP (TorchServe's inference API): a thread per connection.
Step ClosedLoopHttp(const Options& o, const std::vector<std::string>& texts, int concurrency) {
  static const std::regex kUrl(R"(^(https?://[^/]+)(/.*)$)");
  std::smatch m;
  std::regex_match(o.http, m, kUrl);
  const std::string host = m[1].str(), path = m[2].str();
  const auto start =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.duration));
  Recorder rec(start, end);
  std::vector<std::thread> threads;
  // qvi-server's JSON bodies, made before the clock starts.
  std::vector<std::string> bodies;
  if (o.http_body == "json") {
    nlohmann::json options = {{"attention", o.attention}, {"gates", o.gates}};
    if (o.contributions) options["contributions"] = true;
    if (o.occlusion) options["occlusion"] = true;
    for (const std::string& t : texts) bodies.push_back(nlohmann::json{{"texts", {t}}, {"options", options}}.dump());
  }
  const std::vector<std::string>& sent_bodies = bodies.empty() ? texts : bodies;
  const char* content_type = bodies.empty() ? "text/plain" : "application/json";
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client cli(host);
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);  // no Nagle delay between the headers and the body
      cli.set_read_timeout(60);
      for (size_t i = c; Clock::now() < end; i += concurrency) {
        const auto sent = Clock::now();
        auto res = cli.Post(path, headers, sent_bodies[i % sent_bodies.size()], content_type);
        const std::string error = !res ? "HTTP_" + httplib::to_string(res.error())
                                       : (res->status == 200 ? "" : "HTTP_" + std::to_string(res->status));
        rec.Record(sent, Clock::now(), error);
      }
    });
  }
  for (auto& t : threads) t.join();
  return rec.Take("closed", concurrency, o.duration);
}

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--server", o.server, "host:port of a qvi.serving.v1.Inference server")->capture_default_str();
  qvi::AddTlsOptions(app, o.tls);
  app.add_option("--api-key", o.api_key, "the API key of a server with --api-keys")->envname("QVI_API_KEY");
  app.add_option("--http", o.http, "instead: an HTTP endpoint taking one text per POST (TorchServe's inference API)");
  app.add_option("--http-body", o.http_body,
                 "with --http: text (the text is the body, TorchServe) or json ({\"texts\": [text]}, qvi-server's "
                 "POST /v1/models/{m}:classify)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--model", o.model, "model name")->capture_default_str();
  app.add_option("--method", o.method, "classify or tag")
      ->check(CLI::IsMember({"classify", "tag"}))
      ->capture_default_str();
  app.add_option("--protocol", o.protocol,
                 "native (qvi.serving.v1 Classify/Tag), stream (ClassifyStream/TagStream: a stream per channel, "
                 "--concurrency messages in flight over them) or oip (Open Inference Protocol ModelInfer; the "
                 "model's task picks classify or tag)")
      ->check(CLI::IsMember({"native", "stream", "oip"}))
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency, "closed loop: calls in flight, one step each")->delimiter(',');
  app.add_option("--rate", o.rates, "open loop: requests per second, one step each")->delimiter(',');
  app.add_option("--duration", o.duration, "seconds measured per step")->capture_default_str();
  app.add_option("--warmup", o.warmup, "seconds of load before each step's measurement")->capture_default_str();
  app.add_option("--texts-per-request", o.texts_per_request, "texts in each call")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--texts-file", o.texts_file, "texts to send, one per line (default: generated)");
  app.add_option("--pool", o.pool, "generated texts")->capture_default_str();
  app.add_option("--words", o.words, "generated texts: mean length in words")->capture_default_str();
  app.add_option("--words-stddev", o.words_stddev, "generated texts: standard deviation of the length")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "generated texts: seed")->capture_default_str();
  app.add_flag("--attention", o.attention, "ask for α");
  app.add_flag("--gates", o.gates, "ask for β");
  app.add_flag("--contributions", o.contributions, "Classify: ask for each token's contribution to the label");
  app.add_flag("--occlusion", o.occlusion, "ask for leave-one-out: n + 1 forwards per text of n tokens");
  app.add_option("--faithfulness-top-k", o.faithfulness_top_k,
                 "Classify: ask for the faithfulness check of α's top k tokens (a second forward per text)");
  app.add_option("--channels", o.channels, "gRPC connections to spread the calls over")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "threads taking answers and sending the next calls (a completion queue each)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--metrics", o.metrics, "the server's Prometheus URL, for its queue/compute split");
  app.add_option("--json", o.json, "also write the results as JSON to this file");
  app.add_option("--label", o.label, "the system's name in the JSON");
}

// Whether the options go together (the TLS files readable among them); says why not on stderr. Fills
// in the default concurrency steps.
bool CheckOptions(Options& o) {
  try {
    qvi::MakeChannel(o.server, o.tls, grpc::ChannelArguments());  // unreadable TLS files fail here, with their name
  } catch (const std::exception& e) {
    std::cerr << "qvi-perf: " << e.what() << "\n";
    return false;
  }
  if (o.concurrency.empty() && o.rates.empty()) o.concurrency = {1, 2, 4, 8, 16, 32, 64};
  if (o.protocol == "stream" && !o.rates.empty()) {
    std::cerr << "--rate is for unary calls; use --concurrency with --protocol stream\n";
    return false;
  }
  if (!o.http.empty() && !o.rates.empty()) {
    std::cerr << "--rate is for gRPC targets; use --concurrency with --http\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qvi-perf: load generator for qvi-server (closed-loop sweeps, open-loop rates)", "qvi-perf"};
  Options o;
  AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  if (!CheckOptions(o)) return 2;

  std::vector<std::string> texts = o.texts_file.empty()
                                       ? qvi::client::GenerateTexts(o.pool, o.words, o.words_stddev, o.seed)
                                       : qvi::client::ReadTexts(o.texts_file);
  if (texts.size() < static_cast<size_t>(o.texts_per_request)) {
    std::cerr << "not enough texts (" << texts.size() << ")\n";
    return 2;
  }
  std::printf("%-6s %7s %9s %9s %8s %8s %8s %8s %7s %9s %10s %6s %8s %8s %8s\n", "mode", "load", "req/s", "texts/s",
              "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "errors", "queue ms", "compute ms", "batch", "cli µs/r",
              "srv µs/r", "srv sw/r");
  nlohmann::json results = nlohmann::json::array();
  std::unique_ptr<GrpcTarget> target;
  if (o.http.empty()) target = std::make_unique<GrpcTarget>(o, texts);
  auto run = [&](const std::string& mode, double load) {
    // The server's split is read over the measuring window: scraped when the warm-up ends and when
    // the window closes, from a thread beside the load.
    // This process's CPU is read at the same two moments.
    using Sums = decltype(ScrapeSums("", ""));
    Sums before, after;
    double cpu_before = 0, cpu_after = 0;
    const auto t0 = Clock::now();
    auto at = [t0](double seconds) {
      return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    };
    std::thread scraper([&, at] {
      std::this_thread::sleep_until(at(o.warmup));
      cpu_before = ProcessCpuSeconds();
      if (!o.metrics.empty()) before = ScrapeSums(o.metrics, o.model);
      std::this_thread::sleep_until(at(o.warmup + o.duration));
      cpu_after = ProcessCpuSeconds();
      if (!o.metrics.empty()) after = ScrapeSums(o.metrics, o.model);
    });
    Step s = !o.http.empty() ? ClosedLoopHttp(o, texts, static_cast<int>(load))
             : o.protocol == "stream"
                 ? ClosedLoopStream(target->Streams(), static_cast<int>(load), o.warmup, o.duration)
             : mode == "closed" ? ClosedLoopGrpc(*target, static_cast<int>(load), o.warmup, o.duration)
                                : OpenLoopGrpc(*target, load, o.warmup, o.duration);
    scraper.join();
    s.client_cpu_s = cpu_after - cpu_before;
    if (!o.metrics.empty()) FillServerSplit(s, before, after);
    nlohmann::json j = ToJson(s, o.texts_per_request);
    PrintRow(j);
    results.push_back(j);
  };
  for (int c : o.concurrency) run("closed", c);
  for (double r : o.rates) run("open", r);
  if (!o.json.empty()) {
    nlohmann::json doc = {{"label", o.label},       {"target", o.http.empty() ? o.server : o.http},
                          {"model", o.model},       {"method", o.method},
                          {"protocol", o.protocol}, {"texts_per_request", o.texts_per_request},
                          {"words", o.words},       {"steps", results}};
    std::ofstream(o.json) << doc.dump(2) << "\n";
  }
  int64_t ok = 0;
  for (const auto& j : results) ok += j["ok"].get<int64_t>();
  return ok > 0 ? 0 : 1;
}
