#include "server/server.h"

#include <ATen/Parallel.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/alloc/allocator.h"
#include "server/core/base/env.h"
#include "server/core/model/model.h"
#include "server/core/serving/cpu_budget.h"
#include "server/logging.h"

namespace qvi {
namespace {

// Fills in the thread counts left at their defaults (instances, torch, answer and HTTP threads) from
// the CPUs this process may use, read once, logs the choice, and sets torch's thread counts.
void ConfigureThreads(ServerOptions& options) {
  ServerOptions::Threads& t = options.threads;
  const CpuBudget budget = UsableCpus();
  if (t.instances == 0 || t.torch_intra == 0) {
    const auto device = ResolveDevice(options.models.device);
    const bool on_gpu = device.ok() && device->is_cuda();
    const ThreadPlan plan = PlanThreads(budget.cpus, on_gpu);
    if (t.instances == 0) t.instances = plan.instances;
    if (t.torch_intra == 0) t.torch_intra = plan.torch_intra;
    spdlog::info("{} usable CPU(s) ({}), models on the {}: {} instance(s) per model, {} torch thread(s) each",
                 budget.cpus, budget.why, on_gpu ? "GPU" : "CPU", t.instances, t.torch_intra);
  }
  if (t.answers < 0) t.answers = budget.cpus;
  if (options.network.http_threads <= 0) options.network.http_threads = budget.cpus;
  at::set_num_threads(t.torch_intra);
  at::set_num_interop_threads(t.torch_inter);
  spdlog::info("memory allocator: {}", ReadAllocatorStats().allocator);
}

// "pt2, float32, weights not frozen (...)": the format and what the backend says of its build.
std::string FormatDescription(const Model& model) {
  std::vector<std::string> parts = {model.format(), model.precision(), model.compile_note()};
  parts.erase(std::remove(parts.begin(), parts.end(), std::string()), parts.end());
  return absl::StrJoin(parts, ", ");
}

void LogModelEvent(const std::string& name, const VersionStatus& v) {
  if (v.state == ModelState::kLoading) {
    spdlog::info("model {}@{} loading", name, v.version);
  } else if (v.state == ModelState::kUnloading) {
    spdlog::info("model {}@{} UNLOADING ({}): finishing its requests", name, v.version, v.reason);
  } else if (v.state == ModelState::kUnloaded) {
    spdlog::info("model {}@{} unloaded", name, v.version);
  } else if (v.state == ModelState::kReady) {
    const Manifest& m = v.model->manifest();
    const ServingConfig& c = v.serving;
    spdlog::info(
        "model {}@{} READY: {} ({}) on {} from {} ({}), {} labels/tags, max_tokens {}; batches of up to {} "
        "texts / {} tokens / {} ms, {} instance(s); {} of memory{}{}",
        name, v.version, m.display_name, m.task == Task::kClassification ? "classification" : "tagging",
        v.model->device(), std::filesystem::path(v.model->file()).filename().string(), FormatDescription(*v.model),
        m.task == Task::kClassification ? m.labels.size() : m.tags.size(), m.tokenizer.max_tokens, c.max_batch_size,
        c.max_batch_tokens, c.max_queue_delay_ms, c.instances, FormatBytes(v.memory_bytes),
        v.model->has_forward_without_maps() ? "; batches that ask for no attention maps skip them" : "",
        c.abstain_below ? absl::StrCat("; answers below p ", *c.abstain_below,
                                       " marked abstained unless a request sets its own (serving.json)")
                        : "");
    if (!v.model->fallback_reason().empty())
      spdlog::warn("model {}@{}: {}", name, v.version, v.model->fallback_reason());
    const GraphReport& g = v.model->graphs();
    if (g.active) {
      spdlog::info("model {}@{} CUDA graphs: {}; batch sizes [{}], lengths [{}]; captured in {:.0f} ms, {:.1f} MiB",
                   name, v.version, g.note, absl::StrJoin(g.batch_sizes, ","), absl::StrJoin(g.lengths, ","),
                   g.capture_ms, g.memory_bytes / 1048576.0);
    } else if (v.model->torch_device().is_cuda()) {
      spdlog::warn("model {}@{} runs without CUDA graphs: {}", name, v.version, g.note);
    }
  } else {
    spdlog::error("model {}@{} {}: {}", name, v.version, ModelStateName(v.state), v.reason);
  }
}

// Health: overall SERVING once the store is loaded; per model (service name = model name)
// SERVING while it has a ready version. Updated on every model event; after the health service's
// Shutdown() (on SIGTERM) gRPC ignores further updates and everything reads NOT_SERVING.
void PublishModelHealth(grpc::HealthCheckServiceInterface* health, const ModelRepository& repository,
                        const std::string& name) {
  absl::StatusOr<ModelStatus> m = repository.Get(name);
  bool ready = false;
  if (m.ok()) {
    for (const VersionStatus& v : m->versions) ready = ready || v.state == ModelState::kReady;
  }
  health->SetServingStatus(name, ready);
}

void PublishHealth(grpc::HealthCheckServiceInterface* health, const ModelRepository& repository) {
  // The server as a whole ("" service). Not SetServingStatus(bool): that one sets every service,
  // which would mark models without a ready version SERVING.
  health->SetServingStatus("", true);
  for (const ModelStatus& m : repository.List()) PublishModelHealth(health, repository, m.name);
}

// Written whole or not at all (rename), so a reader never sees a partial number.
void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

// Waits `seconds` or until the next signal, whichever comes first.
void WaitForSignalOrTimeout(const sigset_t& signals, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (auto now = std::chrono::steady_clock::now(); now < end; now = std::chrono::steady_clock::now()) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(end - now).count();
    const timespec timeout{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    if (sigtimedwait(&signals, nullptr, &timeout) > 0) return;  // EINTR and EAGAIN: look at the clock again
  }
}

}  // namespace

absl::Status Server::Start() {
  const auto aborted = [this] { return absl::CancelledError("start-up abandoned: the server was told to stop"); };
  if (absl::Status st = StartMetrics(); !st.ok()) return st;
  if (absl::Status st = StartApiKeys(); !st.ok()) return st;  // a bad file stops us before any load
  if (absl::Status st = StartTracing(); !st.ok()) return st;
  if (absl::Status st = StartDecisionLog(); !st.ok()) return st;  // a bad flag stops us before any load
  if (absl::Status st = StartModels(); !st.ok()) return st;
  if (decisions_) decisions_->SetRepository(repository_.get());
  // Abort() may have come while the models loaded: their loads were abandoned, the store shut down.
  if (aborted_) return aborted();
  if (absl::Status st = StartGrpc(); !st.ok()) return st;
  if (absl::Status st = StartHttp(); !st.ok()) return st;
  LogServing();
  if (!options_.network.port_file.empty()) WritePortFile(options_.network.port_file, port_);
  return absl::OkStatus();
}

void Server::Abort() {
  // Either StartModels() sees aborted_ before its first poll, or this sees the repository and shuts
  // it down, which ends that poll at once (both atomics are sequentially consistent).
  aborted_ = true;
  if (ModelRepository* repository = repository_ptr_.load(); repository != nullptr) repository->Shutdown();
}

std::vector<std::string> Server::LoadsStillRunning() const {
  const ModelRepository* repository = repository_ptr_.load();
  return repository == nullptr ? std::vector<std::string>{} : repository->LoadsStillRunning();
}

Server::~Server() {
  // Mirrored work (shadow.h) belongs to no call: whatever the way out (Drain did this; a Start() that failed while
  // serving did not), the threads that may run it stop before the core and the mirror they call are destroyed.
  // Each Shutdown() is a no-op the second time.
  if (shadow_) shadow_->Stop();
  if (executor_) executor_->Shutdown();
  if (repository_) repository_->Shutdown();
  if (answers_) answers_->Shutdown();
}

absl::Status Server::StartMetrics() {
  const ServerOptions::Network& net = options_.network;
  if (net.metrics_port < 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Metrics>> served = Metrics::Serve(net.host, net.metrics_port);
  if (!served.ok()) return served.status();
  metrics_ = *std::move(served);
  metrics_->AddScrapedCounter("qvi_access_log_dropped_lines_total",
                              "Access-log lines dropped because stderr fell behind the calls (see --access-log-queue)",
                              [] { return static_cast<double>(AccessLinesDropped()); });
  metrics_->AddScrapedCounter("qvi_log_lines_suppressed_total",
                              "Lines of gRPC's and protobuf's own logs not written because they came too fast",
                              [] { return static_cast<double>(LibraryLinesSuppressed()); });
  metrics_->AddScrapedCounter("qvi_tls_handshake_failures_total",
                              "TLS handshakes that failed (plain-text clients, clients without a trusted certificate)",
                              [] { return static_cast<double>(TlsHandshakeFailures()); });
  spdlog::info("Prometheus metrics on http://{}:{}/metrics", net.host, metrics_->port());
  if (!net.metrics_port_file.empty()) WritePortFile(net.metrics_port_file, metrics_->port());
  return absl::OkStatus();
}

absl::Status Server::StartModels() {
  spdlog::info("{}", LoadCudaSupport());
  graph_backend_ = LoadCudaGraphBackend();
  spdlog::info("CUDA graphs: {}", !options_.models.cuda_graphs ? std::string("off (--cuda-graphs=false)")
                                  : graph_backend_.ok()
                                      ? std::string("backend loaded")
                                      : absl::StrCat("none (", graph_backend_.status().message(), ")"));
  ConfigureThreads(options_);
  ModelRepository::Options o;
  o.root = options_.models.store;
  o.defaults.device = options_.models.device;
  o.defaults.format = *ParseModelFormat(options_.models.format);  // checked by the flag
  o.defaults.cpu_package = options_.models.cpu_package;           // checked by the flag
  o.defaults.instances = options_.threads.instances;
  o.defaults.max_queued_texts = options_.limits.max_queued_texts;  // 0: by device
  o.defaults.max_queued_tokens = 0;                                // by device
  o.defaults.cuda_graphs.enabled = options_.models.cuda_graphs;
  o.version_policy = *VersionPolicy::Parse(options_.models.version_policy);  // checked by the flag
  o.model_control = options_.models.model_control == "explicit" ? ModelControl::kExplicit : ModelControl::kPoll;
  o.load_at_start = options_.models.load_models;
  o.memory_budget = *ParseMemoryBudget(options_.models.device_memory_budget);   // checked by the flag
  o.unload_idle_after = *ParseIdleDuration(options_.models.unload_idle_after);  // checked by the flag
  o.load_on_demand = options_.models.load_on_demand;
  o.max_waiting_loads = options_.models.max_waiting_loads;
  o.memory_event = [this](const std::string& name, bool loaded, const char* reason) {
    if (!loaded) spdlog::info("model {}: unloaded ({}); it rests until asked for", name, reason);
    if (metrics_) metrics_->OnModelMemoryEvent(name, loaded, reason);
  };
  o.observer = tracing_ ? static_cast<ServingObserver*>(tracing_.get()) : metrics_.get();
  // Before the first load: every version's runner hands its answers to these threads.
  answers_ = std::make_unique<Executor>(options_.threads.answers, /*max_queued=*/0, Env::Default(), "qvi-answer");
  o.answers = answers_.get();
  o.pipeline = options_.threads.pipeline;
  o.load_timeout = absl::Seconds(options_.models.load_timeout_seconds);
  o.load_threads = options_.models.load_threads;
  if (graph_backend_.ok()) {
    o.graph_backend = *graph_backend_;
  } else {
    o.graph_backend_note = std::string(graph_backend_.status().message());
  }
  o.listener = [this](const std::string& name, const VersionStatus& v) {
    LogModelEvent(name, v);
    if (metrics_) metrics_->OnModelEvent(name, v);
    const ModelRepository* repo = repository_ptr_.load();
    grpc::HealthCheckServiceInterface* health = health_ptr_.load();
    if (repo != nullptr && health != nullptr) PublishModelHealth(health, *repo, name);
  };
  o.files_changed = [this](const std::string& name, int64_t version, const absl::Status& reload) {
    if (reload.ok()) {
      spdlog::warn(
          "model {}@{}: its model files changed in place; loaded again, the new files serve now (a new "
          "version folder is the safe way to roll out)",
          name, version);
    } else {
      spdlog::error(
          "model {}@{}: its model files changed in place and did not load ({}); the files loaded before "
          "still serve",
          name, version, std::string(reload.message()));
    }
    if (metrics_) metrics_->OnModelFilesChanged(name, reload.ok());
  };
  absl::StatusOr<std::unique_ptr<ModelRepository>> repository = ModelRepository::Create(o);
  if (!repository.ok()) return repository.status();
  repository_ = *std::move(repository);
  repository_ptr_ = repository_.get();
  if (aborted_) return absl::CancelledError("start-up abandoned: the server was told to stop");
  spdlog::info("loading models from {} (device {}, version policy {})", options_.models.store, options_.models.device,
               options_.models.version_policy);
  repository_->Poll();
  StartCore();
  return absl::OkStatus();
}

void Server::StartCore() {
  executor_ = std::make_unique<Executor>(options_.threads.inference, options_.limits.max_queued);
  RequestLimits limits;
  limits.max_texts = options_.limits.max_texts;
  limits.max_text_bytes = options_.limits.max_text_bytes;
  limits.max_occlusion_tokens = options_.limits.max_occlusion_tokens;
  limits.inline_prepare_bytes = options_.threads.inline_prepare_bytes;
  limits.max_response_bytes = options_.network.max_message_bytes;
  if (options_.models.response_cache_bytes > 0) {
    cache_ = std::make_unique<ResponseCache>(options_.models.response_cache_bytes, metrics_.get());
    spdlog::info("response cache: up to {} of answers", FormatBytes(options_.models.response_cache_bytes));
  }
  core_ = std::make_unique<InferenceService>(repository_.get(), executor_.get(), limits, cache_.get());
  StartRecorders();
  frontend_core_ = std::make_unique<ServingCore>(core_.get());
}

absl::Status Server::StartGrpc() {
  if (absl::Status st = StartTls(); !st.ok()) return st;
  const ServerOptions::Network& net = options_.network;
  calls_ = std::make_unique<Calls>(
      repository_.get(),
      Calls::Options{options_.logging.access_log, metrics_.get(), options_.limits.max_inflight_request_bytes,
                     net.max_message_bytes, options_.logging.trace_rate, api_keys_.get(), otlp_.get(),
                     options_.tracing.sampling_ratio, net.max_metadata_bytes, decisions_.get()});
  MakeGrpcServices();
  grpc::ServerBuilder builder;
  const std::string address = net.host + ":" + std::to_string(net.port);
  builder.AddListeningPort(address, tls_ ? tls_->credentials() : grpc::InsecureServerCredentials(), &port_);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // else a second server shares the port silently
  builder.SetMaxReceiveMessageSize(net.max_message_bytes);
  // gRPC 1.51's HPACK parser fails the whole connection -- every call on it -- on a header frame over
  // this (a per-frame count; soft per-call limits came in 1.54): so it sits far above the per-call
  // limit the calls enforce themselves (Calls::Options::max_metadata_bytes), which refuses one call.
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, std::max(256 << 10, 4 * net.max_metadata_bytes));
  builder.SetMaxSendMessageSize(net.max_message_bytes);
  const auto ms = [](double seconds) { return static_cast<int>(seconds * 1000); };
  grpc::ResourceQuota quota("qvi-server");
  quota.Resize(static_cast<size_t>(net.grpc_memory_quota_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, net.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(net.keepalive_time_seconds));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(net.keepalive_timeout_seconds));
  // Keepalive enforcement: clients may ping without calls, but not more often than the interval; the
  // second ping too early ends their connection (GOAWAY too_many_pings).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             ms(net.min_client_ping_interval_seconds));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  if (net.max_connection_idle_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(net.max_connection_idle_seconds));
  }
  if (net.max_connection_age_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(net.max_connection_age_seconds));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, ms(net.max_connection_age_grace_seconds));
  }
  builder.RegisterService(service_.get());
  builder.RegisterService(oip_.get());
  builder.RegisterService(tei_info_.get());
  builder.RegisterService(tei_predict_.get());
  builder.RegisterService(tei_tokenize_.get());
  builder.RegisterCallbackGenericService(repository_service_.get());  // the methods no service above has
  builder.RegisterService(reflection_.get());
  builder.RegisterService(reflection_alpha_.get());
  server_ = builder.BuildAndStart();
  const char* in_use = " (--port): is another process listening there?";
  if (!server_ || port_ == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", address, in_use));
  health_ptr_ = server_->GetHealthCheckService();
  PublishHealth(server_->GetHealthCheckService(), *repository_);
  serving_ = true;
  if (options_.models.poll_seconds > 0) {
    repository_->StartPolling(absl::Milliseconds(static_cast<int64_t>(options_.models.poll_seconds * 1000)));
  }
  return absl::OkStatus();
}

absl::Status Server::StartHttp() {
  const ServerOptions::Network& net = options_.network;
  if (net.http_port < 0) return absl::OkStatus();
  HttpApi::Options api;
  api.cors_origins = net.http_cors_allow_origins;
  api.explain_page = net.http_explain_page;
  api.repository_control = oip_repository_.get();
  api.default_model = options_.models.default_model;
  api.tokenization_workers = options_.threads.inference;
  http_api_ = std::make_unique<HttpApi>(frontend_core_.get(), repository_.get(), calls_.get(), oip_api_.get(),
                                        &serving_, std::move(api));
  HttpServer::Options o;
  o.host = net.host;
  o.port = net.http_port;
  o.threads = net.http_threads;  // ConfigureThreads set the default
  o.header_timeout_seconds = net.http_header_timeout_seconds;
  o.idle_timeout_seconds = net.http_idle_timeout_seconds;
  o.max_header_bytes = static_cast<uint32_t>(net.http_max_header_bytes);
  o.max_body_bytes = static_cast<uint64_t>(net.max_message_bytes);
  if (tls_) {
    // HTTPS with the gRPC port's files, reloaded with them: never plain text beside a TLS port.
    o.tls = HttpServer::TlsContexts([tls = tls_] {
      auto [set, generation] = tls->current();
      return std::make_pair(HttpServer::TlsPem{set.cert_pem, set.key_pem, set.client_ca_pem}, generation);
    });
  }
  http_ = std::make_unique<HttpServer>(o, [api = http_api_.get()](HttpRequest request, HttpServer::Reply reply) {
    api->Handle(std::move(request), std::move(reply));
  });
  absl::StatusOr<int> port = http_->Start();
  if (!port.ok()) return port.status();
  http_port_ = *port;
  if (!net.http_port_file.empty()) WritePortFile(net.http_port_file, http_port_);
  spdlog::info("serving HTTP/JSON on {}:{} over {} ({} thread(s)){}", net.host, http_port_,
               !tls_                            ? "plain text"
               : options_.tls.client_ca.empty() ? "TLS"
                                                : "mutual TLS",
               o.threads, net.http_explain_page ? "; the explanation page is at /" : "");
  return absl::OkStatus();
}

void Server::LogServing() const {
  size_t ready = 0, total = 0;
  for (const ModelStatus& m : repository_->List()) {
    for (const VersionStatus& v : m.versions) {
      ++total;
      ready += v.state == ModelState::kReady;
    }
  }
  const std::string transport = options_.tls.cert.empty()        ? "plain text"
                                : options_.tls.client_ca.empty() ? "TLS"
                                                                 : "mutual TLS";
  spdlog::info(
      "serving qvi.serving.v1.Inference and inference.GRPCInferenceService (OIP v2) on {}:{} over {} ({} of {} model "
      "versions ready, {} request threads, {} instance(s) per model, torch {} intra-op thread(s), {} answer threads)",
      options_.network.host, port_, transport, ready, total, options_.threads.inference, options_.threads.instances,
      options_.threads.torch_intra, options_.threads.answers);
}

int Server::Drain(int signal, const sigset_t& signals) {
  spdlog::info("received signal {}: reporting NOT_SERVING, finishing accepted requests (grace {} s)", signal,
               options_.shutdown_grace_seconds);
  serving_ = false;
  if (shadow_) shadow_->Stop();  // nothing more mirrored into the queues being drained
  server_->GetHealthCheckService()->Shutdown();
  if (options_.shutdown_delay_seconds > 0) {
    spdlog::info("NOT_SERVING for {} s while still taking calls", options_.shutdown_delay_seconds);
    WaitForSignalOrTimeout(signals, options_.shutdown_delay_seconds);
  }
  const auto grace = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(options_.shutdown_grace_seconds * 1000));
  // gRPC stops accepting and gives the calls in flight until the grace period ends; then the request
  // threads and every version's batch queue drain. gRPC's callback server waits for every call to be
  // answered, and a call is answered when its batch ends, so a forward pass that never ends (a hung
  // model or device) would keep the process alive: the whole sequence gets until kDrainAllowance
  // after the grace period, then the caller exits 1 without it.
  constexpr auto kDrainAllowance = std::chrono::seconds(2);
  auto drained = std::make_shared<std::promise<void>>();
  std::future<void> drained_future = drained->get_future();
  std::thread drain = Env::Default()->StartThread("qvi-drain", [this, grace, drained] {
    if (http_) http_->Shutdown(grace);  // stops accepting; its requests in flight get the grace too
    server_->Shutdown(grace);
    spdlog::debug("gRPC server shut down");
    executor_->Shutdown();
    spdlog::debug("request threads drained");
    repository_->Shutdown();
    answers_->Shutdown();
    if (decisions_) decisions_->Flush();  // every answered call's line on disk before the process may _Exit
    spdlog::debug("model queues drained, models unloaded");
    if (otlp_) otlp_->Stop();                    // the last spans, within --otlp-timeout-seconds
    if (decision_otlp_) decision_otlp_->Stop();  // and the decision log's last records
    drained->set_value();
  });
  if (drained_future.wait_until(grace + kDrainAllowance) != std::future_status::ready) {
    spdlog::error(
        "shutdown had not finished {} s after the grace period ended (a call or a batch still "
        "running: a hung model?); exiting without it",
        std::chrono::duration_cast<std::chrono::seconds>(kDrainAllowance).count());
    drain.detach();
    return 1;
  }
  drain.join();
  server_->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace qvi
