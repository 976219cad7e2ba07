// gRPC's own cost per call, by API: a Classify server that does no work at all -- it answers every
// call with one fixed, serialised ClassifyResponse -- on gRPC's callback API (what qvi-server's front
// ends use) or on its asynchronous completion-queue API with polling threads of its own (what
// Triton's gRPC front end uses). The answer is sent from the thread that took the call (--handoff
// inline) or from a worker thread that takes the waiting calls a batch at a time, as qvi-server's
// instance threads do (--handoff worker). Run under qvi-perf with --metrics pointing at this
// program's /metrics (process_cpu_seconds_total, nothing else), it measures the CPU each API costs
// per request, before a front end is rewritten for it (docs/performance.md, issue 33).
// --api http does the same for the HTTP/JSON route: qvi-server's own HTTP server (server/http/
// http_server.h, Boost.Beast, its two threads) answering every POST with one fixed JSON answer, shaped
// as qvi-server's :classify answer for one text; its port goes to --port-file.
// bench/grpc_front_ab.py runs the configurations side by side.
//
//   qvi-bench-grpc-front --api async --threads 1 --handoff worker --port-file P --metrics-port-file M
//   qvi-bench-grpc-front --api http --handoff worker --port-file P --metrics-port-file M
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"
#include "qvi/serving/v1/inference.grpc.pb.h"
#include "server/core/sched/cpu_policy.h"
#include "server/http/http_server.h"

namespace {

namespace v1 = qvi::serving::v1;

std::atomic<bool> g_stop{false};

// The answer every call gets: one text's classification, two labels, as the null model's is shaped.
std::string FixedAnswer() {
  v1::ClassifyResponse response;
  response.mutable_model()->set_name("sentiment");
  response.mutable_model()->set_version(1);
  v1::Classification* c = response.add_results();
  c->set_num_tokens(20);
  for (const char* label : {"negative", "positive"}) {
    v1::LabelScore* s = c->add_labels();
    s->set_label(label);
    s->set_score(0.5F);
  }
  return response.SerializeAsString();
}

grpc::ByteBuffer AnswerBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A queue of waiting calls and the thread that answers them a batch at a time.
template <typename Call>
class Worker {
 public:
  explicit Worker(std::function<void(Call)> answer) : answer_(std::move(answer)), thread_([this] { Run(); }) {}
  ~Worker() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  void Push(Call call) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
  }

 private:
  void Run() {
    std::deque<Call> batch;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->done_ || !w->queue_.empty(); }, this));
        if (done_ && queue_.empty()) return;
        batch.swap(queue_);
      }
      for (Call& call : batch) answer_(std::move(call));
      batch.clear();
    }
  }
  std::function<void(Call)> answer_;
  absl::Mutex mu_;
  std::deque<Call> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// --- the callback API, as qvi-server's front ends take Classify ---------------------------------
class CallbackClassify final : public v1::Inference::WithRawCallbackMethod_Classify<v1::Inference::CallbackService> {
 public:
  CallbackClassify(std::string answer, bool worker)
      : answer_(std::move(answer)),
        worker_(worker ? std::make_unique<Worker<Pending>>([this](Pending p) { Finish(p); }) : nullptr) {}

  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* /*request*/,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (worker_) {
      worker_->Push({reactor, response});
    } else {
      Finish({reactor, response});
    }
    return reactor;
  }

 private:
  struct Pending {
    grpc::ServerUnaryReactor* reactor;
    grpc::ByteBuffer* response;
  };
  void Finish(const Pending& p) {
    *p.response = AnswerBuffer(answer_);
    p.reactor->Finish(grpc::Status::OK);
  }
  const std::string answer_;
  std::unique_ptr<Worker<Pending>> worker_;
};

// --- the asynchronous API: completion queues polled by this program's own threads --------------
using AsyncService = v1::Inference::WithRawMethod_Classify<v1::Inference::AsyncService>;

class AsyncFront {
 public:
  AsyncFront(AsyncService* service, std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs, std::string answer,
             bool worker)
      : service_(service), cqs_(std::move(cqs)), answer_(std::move(answer)) {
    if (worker) worker_ = std::make_unique<Worker<Call*>>([this](Call* c) { Answer(c); });
  }

  void Run() {
    std::vector<std::thread> threads;
    for (auto& cq : cqs_) {
      for (int i = 0; i < 64; ++i) Listen(cq.get());  // calls accepted at once on each queue
      threads.emplace_back([this, cq = cq.get()] { Poll(cq); });
    }
    for (auto& t : threads) t.join();
  }
  void Shutdown() {
    worker_.reset();  // answers what waits
    for (auto& cq : cqs_) cq->Shutdown();
  }

 private:
  struct Call {
    explicit Call(grpc::ServerCompletionQueue* q) : cq(q), writer(&ctx) {}
    grpc::ServerCompletionQueue* cq;
    grpc::ServerContext ctx;
    grpc::ByteBuffer request;
    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer;
    bool answered = false;
  };
  void Listen(grpc::ServerCompletionQueue* cq) {
    auto* call = new Call(cq);
    service_->RequestClassify(&call->ctx, &call->request, &call->writer, cq, cq, call);
  }
  void Answer(Call* call) {
    call->answered = true;
    call->writer.Finish(AnswerBuffer(answer_), grpc::Status::OK, call);
  }
  void Poll(grpc::ServerCompletionQueue* cq) {
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
      auto* call = static_cast<Call*>(tag);
      if (!ok || call->answered) {  // the answer went (or the server is shutting down)
        delete call;
        continue;
      }
      if (!g_stop.load()) Listen(cq);  // the next call's slot
      if (worker_) {
        worker_->Push(call);
      } else {
        Answer(call);
      }
    }
  }
  AsyncService* service_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  const std::string answer_;
  std::unique_ptr<Worker<Call*>> worker_;
};

// --- HTTP/JSON, on qvi-server's HTTP server ----------------------------------------------------
// What qvi-server answers a one-text POST /v1/models/sentiment:classify on the null model.
constexpr char kJsonAnswer[] =
    R"({"model":{"name":"sentiment","version":"1"},"results":[{"labels":[{"label":"negative","score":0.5}],)"
    R"("tokens":[],"truncated":false,"numTokens":20,"layers":[]}],"requestId":"req-1"})";

class HttpFront {
 public:
  explicit HttpFront(bool worker)
      : worker_(worker ? std::make_unique<Worker<qvi::HttpServer::Reply>>(
                             [](qvi::HttpServer::Reply reply) { reply(Answer()); })
                       : nullptr) {
    qvi::HttpServer::Options options;
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<qvi::HttpServer>(options, [this](qvi::HttpRequest, qvi::HttpServer::Reply reply) {
      if (worker_) {
        worker_->Push(std::move(reply));
      } else {
        reply(Answer());
      }
    });
  }
  ~HttpFront() { Shutdown(); }
  absl::StatusOr<int> Start() { return server_->Start(); }
  void Shutdown() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
    worker_.reset();
  }

 private:
  static qvi::HttpResponse Answer() {
    qvi::HttpResponse response;
    response.body = kJsonAnswer;
    response.headers.emplace_back("X-Request-Id", "req-1");
    return response;
  }
  std::unique_ptr<Worker<qvi::HttpServer::Reply>> worker_;
  std::unique_ptr<qvi::HttpServer> server_;
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Returns once SIGTERM or SIGINT came (the handlers are set on the first call).
void WaitForStopSignal() {
  std::signal(SIGTERM, [](int) { g_stop.store(true); });
  std::signal(SIGINT, [](int) { g_stop.store(true); });
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

void WriteFile(const std::string& path, int value) {
  std::ofstream(path + ".tmp") << value << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Serves --api http until SIGTERM: the HTTP threads run under the default policy as qvi-server's do
// (HttpServer puts them there), the worker under SCHED_BATCH with --sched-batch.
int ServeHttp(bool worker, bool sched_batch, const std::string& port_file, const std::string& metrics_port_file,
              httplib::Server& metrics, std::thread& metrics_thread, int metrics_port) {
  if (sched_batch) {
    if (absl::Status s = qvi::UseBatchScheduling(); !s.ok()) std::cerr << s << "\n";
  }
  HttpFront front(worker);
  absl::StatusOr<int> port = front.Start();
  if (!port.ok()) {
    std::cerr << port.status() << "\n";
    return 1;
  }
  WriteFile(port_file, *port);
  WriteFile(metrics_port_file, metrics_port);
  WaitForStopSignal();
  front.Shutdown();
  metrics.stop();
  metrics_thread.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string api = "callback", handoff = "inline", port_file, metrics_port_file;
  int threads = 1;
  bool sched_batch = true;
  std::vector<std::string> channel_args;
  CLI::App app{"gRPC's own cost per call: a Classify server that answers a fixed message"};
  app.add_option("--api", api, "callback or async (gRPC), or http (qvi-server's HTTP server, a fixed JSON answer)")
      ->check(CLI::IsMember({"callback", "async", "http"}));
  app.add_option("--handoff", handoff, "inline: answer on the thread that took the call; worker: from a worker thread")
      ->check(CLI::IsMember({"inline", "worker"}));
  app.add_option("--threads", threads, "async: completion queues, each polled by a thread of its own")
      ->check(CLI::Range(1, 64));
  app.add_option("--port-file", port_file, "write the gRPC (or HTTP) port here")->required();
  app.add_option("--metrics-port-file", metrics_port_file, "write the /metrics port here")->required();
  app.add_option("--sched-batch", sched_batch, "every thread under SCHED_BATCH, as qvi-server's")
      ->capture_default_str();
  app.add_option("--channel-arg", channel_args, "NAME=INTEGER, a gRPC channel argument (e.g. grpc.minimal_stack=1)");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::pair<std::string, int>> args;
  for (const std::string& arg : channel_args) {
    const size_t eq = arg.find('=');
    int value = 0;
    if (eq == std::string::npos || eq == 0 || !absl::SimpleAtoi(arg.substr(eq + 1), &value)) {
      std::cerr << "--channel-arg takes NAME=INTEGER, not " << arg << "\n";
      return 2;
    }
    args.emplace_back(arg.substr(0, eq), value);
  }

  httplib::Server metrics;
  metrics.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("process_cpu_seconds_total " + std::to_string(ProcessCpuSeconds()) + "\n", "text/plain");
  });
  const int metrics_port = metrics.bind_to_any_port("127.0.0.1");
  std::thread metrics_thread([&metrics] { metrics.listen_after_bind(); });

  if (api == "http") {
    return ServeHttp(handoff == "worker", sched_batch, port_file, metrics_port_file, metrics, metrics_thread,
                     metrics_port);
  }
  const std::string answer = FixedAnswer();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  for (const auto& [name, value] : args) builder.AddChannelArgument(name, value);
  std::unique_ptr<CallbackClassify> callback;
  AsyncService async_service;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (api == "callback") {
    callback = std::make_unique<CallbackClassify>(answer, handoff == "worker");
    builder.RegisterService(callback.get());
  } else {
    builder.RegisterService(&async_service);
    for (int i = 0; i < threads; ++i) cqs.push_back(builder.AddCompletionQueue());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "the gRPC server did not start\n";
    return 1;
  }
  std::unique_ptr<AsyncFront> front;
  if (api == "async") front = std::make_unique<AsyncFront>(&async_service, std::move(cqs), answer, handoff == "worker");
  if (sched_batch) {
    if (absl::Status s = qvi::UseBatchScheduling(); !s.ok()) std::cerr << s << "\n";
  }
  WriteFile(port_file, port);
  WriteFile(metrics_port_file, metrics_port);

  std::thread front_thread;
  if (front) front_thread = std::thread([&front] { front->Run(); });
  WaitForStopSignal();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (front) {
    front->Shutdown();
    front_thread.join();
  }
  metrics.stop();
  metrics_thread.join();
  return 0;
}
