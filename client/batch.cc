#include "client/batch.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "client/errors.h"
#include "nlohmann/json.hpp"

namespace qvi::client {

namespace v1 = ::qvi::serving::v1;
using Clock = std::chrono::steady_clock;

int64_t BatchSummary::failed() const {
  int64_t n = 0;
  for (const auto& [code, count] : errors) n += count;
  return n;
}

std::string BatchSummary::Line() const {
  std::string codes;
  for (const auto& [code, count] : errors) codes += (codes.empty() ? "" : ", ") + code + " " + std::to_string(count);
  const double rate = seconds > 0 ? static_cast<double>(answered + failed()) / seconds : 0.0;
  char tail[96];
  std::snprintf(tail, sizeof(tail), "%.1f s, %.1f texts/s", seconds, rate);
  return std::to_string(texts) + " texts: " + std::to_string(answered) + " answered, " + std::to_string(failed()) +
         " failed (" + (codes.empty() ? "none" : codes) + "), " + std::to_string(skipped) + " already in the output; " +
         std::to_string(retries) + " requests sent again; " + tail;
}

namespace {

std::string CodeName(int code) { return absl::StatusCodeToString(static_cast<absl::StatusCode>(code)); }

bool Retryable(int code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

struct Chunk {
  std::vector<const BatchText*> texts;
  int attempts = 0;
};

// One run: the chunks not yet resolved, each ready to send or waiting for its retry time, and what
// the streams write and read.
template <typename Request, typename StreamResponse>
class Run {
 public:
  Run(v1::Inference::Stub& stub, const BatchOptions& o, int64_t texts, std::ostream& out, BatchSummary* summary)
      : stub_(stub), o_(o), out_(out), summary_(summary), progress_(o.task + " " + o.model, texts, o.progress) {}

  grpc::Status Score(const std::vector<BatchText>& todo) {
    for (size_t k = 0; k < todo.size(); k += o_.texts_per_request) {
      chunks_.push_back(std::make_unique<Chunk>());
      for (size_t i = k; i < std::min(todo.size(), k + o_.texts_per_request); ++i) {
        chunks_.back()->texts.push_back(&todo[i]);
      }
      ready_.push_back(chunks_.back().get());
    }
    unresolved_ = static_cast<int64_t>(chunks_.size());
    int broken = 0;
    while (unresolved_ > 0) {
      grpc::Status s = Stream();
      if (s.ok()) {
        broken = 0;
        continue;
      }
      if (!Retryable(s.error_code()) && s.error_code() != grpc::StatusCode::INTERNAL) return s;
      if (++broken > o_.retries) return s;
      std::this_thread::sleep_for(Pause(broken, 0));
    }
    progress_.Close();
    return grpc::Status::OK;
  }

 private:
  // Full jitter under an exponential ceiling, never sooner than the server's advice.
  Clock::duration Pause(int attempt, int64_t advice_ms) {
    const double ceiling =
        std::min(o_.backoff_seconds * std::pow(2.0, std::max(0, attempt - 1)), o_.max_backoff_seconds);
    const double drawn = std::uniform_real_distribution<double>(0, ceiling)(rng_);
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::max(drawn, static_cast<double>(advice_ms) / 1000)));
  }

  // The next chunk to send, waiting for room on the stream and for a chunk whose time has come;
  // null once the stream is to end.
  Chunk* NextToSend(std::unique_lock<std::mutex>& lock) {
    while (true) {
      if (stop_ || unresolved_ == 0) return nullptr;
      const Clock::time_point now = Clock::now();
      while (!later_.empty() && later_.begin()->first <= now) {
        ready_.push_back(later_.begin()->second);
        later_.erase(later_.begin());
      }
      if (inflight_ < o_.concurrency && !ready_.empty()) {
        Chunk* chunk = ready_.front();
        ready_.pop_front();
        return chunk;
      }
      if (later_.empty() || inflight_ >= o_.concurrency) {
        changed_.wait(lock);
      } else {
        changed_.wait_until(lock, later_.begin()->first);
      }
    }
  }

  Request RequestOf(const Chunk& chunk) const {
    Request r;
    r.mutable_model()->set_name(o_.model);
    r.mutable_model()->set_version(o_.version);
    *r.mutable_options() = o_.outputs;
    r.set_priority(o_.priority);
    for (const BatchText* t : chunk.texts) r.add_texts(t->text);
    return r;
  }

  // One stream until every chunk is resolved (OK) or it breaks (its status; the chunks it had not
  // answered are ready again).
  grpc::Status Stream() {
    grpc::ClientContext ctx;
    if (!o_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o_.api_key);
    std::unique_ptr<grpc::ClientReaderWriter<Request, StreamResponse>> stream = Open(ctx);
    std::map<int64_t, Chunk*> sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = false;
      inflight_ = 0;
    }
    std::thread writer([&] {
      int64_t index = 0;
      std::unique_lock<std::mutex> lock(mu_);
      while (Chunk* chunk = NextToSend(lock)) {
        sent[index++] = chunk;
        ++inflight_;
        lock.unlock();
        const bool written = stream->Write(RequestOf(*chunk));
        lock.lock();
        if (!written) break;
      }
      lock.unlock();
      stream->WritesDone();
    });
    StreamResponse answer;
    while (stream->Read(&answer)) Take(answer, sent);
    bool complete;
    {
      std::lock_guard<std::mutex> lock(mu_);
      complete = unresolved_ == 0;
      stop_ = true;
    }
    changed_.notify_all();
    if (!complete) ctx.TryCancel();  // a writer blocked on the broken stream returns
    writer.join();
    grpc::Status status = stream->Finish();
    if (complete) return grpc::Status::OK;
    if (status.ok()) status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended before every answer");
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [index, chunk] : sent) ready_.push_back(chunk);
    summary_->retries += static_cast<int64_t>(sent.size());
    return status;
  }

  std::unique_ptr<grpc::ClientReaderWriter<Request, StreamResponse>> Open(grpc::ClientContext& ctx);

  void Take(const StreamResponse& answer, std::map<int64_t, Chunk*>& sent) {
    Chunk* chunk;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sent.find(answer.index());
      if (it == sent.end()) return;  // not ours: the server's bug, never a reason to stop
      chunk = it->second;
      sent.erase(it);
      --inflight_;
    }
    changed_.notify_all();
    if (answer.has_response()) {
      Write(*chunk, answer);
      summary_->answered += static_cast<int64_t>(chunk->texts.size());
      return Resolved(*chunk);
    }
    if (Retryable(answer.error().code()) && chunk->attempts < o_.retries) {
      ++chunk->attempts;
      ++summary_->retries;
      {
        std::lock_guard<std::mutex> lock(mu_);
        later_.emplace(Clock::now() + Pause(chunk->attempts, answer.error().retry_after_ms()), chunk);
      }
      changed_.notify_all();  // it may be due before what the writer waits for
      return;
    }
    const std::string code = CodeName(answer.error().code());
    for (const BatchText* t : chunk->texts) {
      out_ << nlohmann::json{{"id", t->id}, {"error", {{"code", code}, {"message", answer.error().message()}}}}.dump()
           << "\n";
    }
    summary_->errors[code] += static_cast<int64_t>(chunk->texts.size());
    Resolved(*chunk);
  }

  void Write(const Chunk& chunk, const StreamResponse& answer) {
    google::protobuf::util::JsonPrintOptions json;
    json.preserve_proto_field_names = true;
    json.always_print_primitive_fields = true;  // a token at offset 0 says "start": 0, as the HTTP API
    const auto& r = answer.response();
    for (int i = 0; i < r.results_size() && i < static_cast<int>(chunk.texts.size()); ++i) {
      std::string result;
      (void)google::protobuf::util::MessageToJsonString(r.results(i), &result, json);
      out_ << nlohmann::json{{"id", chunk.texts[i]->id},
                             {"model", r.model().name()},
                             {"version", r.model().version()},
                             {"result", nlohmann::json::parse(result)}}
                  .dump()
           << "\n";
    }
  }

  void Resolved(const Chunk& chunk) {
    out_.flush();
    progress_.Add(static_cast<int64_t>(chunk.texts.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      --unresolved_;
    }
    changed_.notify_all();
  }

  v1::Inference::Stub& stub_;
  const BatchOptions& o_;
  std::ostream& out_;
  BatchSummary* summary_;
  ProgressLine progress_;
  std::mt19937 rng_{std::random_device{}()};
  std::vector<std::unique_ptr<Chunk>> chunks_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Chunk*> ready_;
  std::multimap<Clock::time_point, Chunk*> later_;
  int64_t unresolved_ = 0;
  int inflight_ = 0;
  bool stop_ = false;
};

template <>
std::unique_ptr<grpc::ClientReaderWriter<v1::ClassifyRequest, v1::ClassifyStreamResponse>>
Run<v1::ClassifyRequest, v1::ClassifyStreamResponse>::Open(grpc::ClientContext& ctx) {
  return stub_.ClassifyStream(&ctx);
}

template <>
std::unique_ptr<grpc::ClientReaderWriter<v1::TagRequest, v1::TagStreamResponse>>
Run<v1::TagRequest, v1::TagStreamResponse>::Open(grpc::ClientContext& ctx) {
  return stub_.TagStream(&ctx);
}

}  // namespace

grpc::Status RunBatch(v1::Inference::Stub& stub, const BatchOptions& options, const std::vector<BatchText>& todo,
                      std::ostream& out, BatchSummary* summary) {
  const auto texts = static_cast<int64_t>(todo.size());
  if (options.task == "tag") {
    return Run<v1::TagRequest, v1::TagStreamResponse>(stub, options, texts, out, summary).Score(todo);
  }
  return Run<v1::ClassifyRequest, v1::ClassifyStreamResponse>(stub, options, texts, out, summary).Score(todo);
}

CLI::App* AddBatchCommand(CLI::App& app, BatchOptions& o, std::vector<std::string>& explain) {
  CLI::App* sub = app.add_subcommand(
      "batch",
      "score a file of texts (JSONL {\"id\", \"text\"} per line, CSV with a header, or a text per line) into "
      "JSONL answers over one stream; run it again to resume");
  sub->add_option("input", o.input, "the texts")->required()->check(CLI::ExistingFile);
  sub->add_option("output", o.output, "the answers, appended to; ids already answered there are skipped")->required();
  sub->add_option("--model", o.model, "model name")->required();
  sub->add_option("--version", o.version, "model version; 0 = newest ready");
  sub->add_option("--task", o.task, "classify or tag")
      ->check(CLI::IsMember({"classify", "tag"}))
      ->capture_default_str();
  sub->add_option("--explain", explain, "explanations to ask for: attention, gates, contributions, tokens")
      ->delimiter(',')
      ->check(CLI::IsMember({"attention", "gates", "contributions", "tokens"}));
  sub->add_option("--format", o.format, "jsonl, csv or text (default: from the input's extension)")
      ->check(CLI::IsMember({"jsonl", "csv", "text"}));
  sub->add_option("--text-field", o.text_field, "the text's field or column")->capture_default_str();
  sub->add_option("--id-field", o.id_field, "the id's field or column")->capture_default_str();
  sub->add_option("--texts-per-request", o.texts_per_request, "texts in each request of the stream")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  sub->add_option("--concurrency", o.concurrency, "requests in flight on the stream")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--retries", o.retries,
                  "times a request refused with UNAVAILABLE or RESOURCE_EXHAUSTED is sent again")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  return sub;
}

int RunBatchCommand(v1::Inference::Stub& stub, BatchOptions o, const std::vector<std::string>& explain,
                    const std::string& server) {
  const auto start = Clock::now();
  for (const std::string& e : explain) {
    if (e == "attention") o.outputs.set_attention(true);
    if (e == "gates") o.outputs.set_gates(true);
    if (e == "contributions") o.outputs.set_contributions(true);
    if (e == "tokens") o.outputs.set_tokens(true);
  }
  o.progress = isatty(STDERR_FILENO) != 0;
  std::vector<BatchText> texts;
  try {
    std::ifstream in(o.input);
    texts = ReadBatchTexts(in, o.format.empty() ? FormatOf(o.input) : o.format, o.text_field, o.id_field);
  } catch (const std::exception& e) {
    std::cerr << "qvi-client batch: " << o.input << ": " << e.what() << "\n";
    return 2;
  }
  const std::set<std::string> done = AnsweredIds(o.output);
  std::vector<BatchText> todo;
  for (BatchText& t : texts) {
    if (done.count(t.id.dump()) == 0) todo.push_back(std::move(t));
  }
  BatchSummary summary;
  summary.texts = static_cast<int64_t>(texts.size());
  summary.skipped = summary.texts - static_cast<int64_t>(todo.size());
  std::ofstream out(o.output, std::ios::app);
  if (!out) {
    std::cerr << "qvi-client batch: cannot write " << o.output << "\n";
    return 2;
  }
  const grpc::Status s = RunBatch(stub, o, todo, out, &summary);
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cerr << summary.Line() << "\n";
  if (!s.ok()) {
    std::cerr << ErrorLines(s, server);
    return 2;
  }
  return summary.failed() > 0 ? 1 : 0;
}

}  // namespace qvi::client
