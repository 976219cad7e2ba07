// qvi-server: parse options, load the model store, serve qvi.serving.v1.Inference with health and
// reflection, and on SIGTERM/SIGINT drain and exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.pb.h"
#include "server/core/alloc/allocator.h"
#include "server/core/model/model.h"
#include "server/core/sched/env.h"
#include "server/core/sched/executor.h"
#include "server/core/serving/cpu_budget.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/model_repository.h"
#include "server/grpc/inference_service_impl.h"
#include "server/grpc/oip_service.h"
#include "server/logging.h"
#include "server/metrics/metrics.h"
#include "server/server_options.h"

namespace qvi {
namespace {

// Plain text, or TLS from files that gRPC reads again every reload_seconds (a renewed certificate
// takes effect for new connections); with a client CA, clients must present a certificate it signed.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const ServerOptions::Tls& tls) {
  if (tls.cert.empty()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key, tls.cert, tls.client_ca, static_cast<unsigned int>(tls.reload_seconds));
  grpc::experimental::TlsServerCredentialsOptions credentials(provider);
  credentials.watch_identity_key_cert_pairs();
  if (!tls.client_ca.empty()) {
    credentials.watch_root_certs();
    credentials.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    credentials.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(credentials);
}

// Fills in the instance and torch thread counts left at 0 (the defaults) from the CPUs this process
// may use, logs the choice, and sets torch's thread counts.
void ConfigureThreads(ServerOptions& options) {
  ServerOptions::Threads& t = options.threads;
  if (t.instances == 0 || t.torch_intra == 0) {
    const CpuBudget budget = UsableCpus();
    const auto device = ResolveDevice(options.models.device);
    const bool on_gpu = device.ok() && device->is_cuda();
    const ThreadPlan plan = PlanThreads(budget.cpus, on_gpu);
    if (t.instances == 0) t.instances = plan.instances;
    if (t.torch_intra == 0) t.torch_intra = plan.torch_intra;
    spdlog::info("{} usable CPU(s) ({}), models on the {}: {} instance(s) per model, {} torch thread(s) each",
                 budget.cpus, budget.why, on_gpu ? "GPU" : "CPU", t.instances, t.torch_intra);
  }
  torch::set_num_threads(t.torch_intra);
  torch::set_num_interop_threads(t.torch_inter);
  spdlog::info("memory allocator: {}", ReadAllocatorStats().allocator);
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
        "texts / {} tokens / {} ms, {} instance(s){}",
        name, v.version, m.display_name, m.task == Task::kClassification ? "classification" : "tagging",
        v.model->device(), std::filesystem::path(v.model->file()).filename().string(), v.model->format(),
        m.task == Task::kClassification ? m.labels.size() : m.tags.size(), m.tokenizer.max_tokens, c.max_batch_size,
        c.max_batch_tokens, c.max_queue_delay_ms, c.instances,
        v.model->has_forward_without_maps() ? "; batches that ask for no attention maps skip them" : "");
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

int WaitForSignal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
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

int Run(ServerOptions options, const sigset_t& signals) {
  ConfigureLogging(options.logging.level, options.logging.format == "json" ? LogFormat::kJson : LogFormat::kText,
                   static_cast<size_t>(options.logging.access_log_queue));
  std::unique_ptr<Metrics> metrics;
  if (options.network.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<Metrics>> served =
        Metrics::Serve(options.network.host, options.network.metrics_port);
    if (!served.ok()) {
      spdlog::critical("{}", std::string(served.status().message()));
      return 1;
    }
    metrics = *std::move(served);
    metrics->AddScrapedCounter("qvi_access_log_dropped_lines_total",
                               "Access-log lines dropped because stderr fell behind the calls (see --access-log-queue)",
                               [] { return static_cast<double>(AccessLinesDropped()); });
    spdlog::info("Prometheus metrics on http://{}:{}/metrics", options.network.host, metrics->port());
    if (!options.network.metrics_port_file.empty()) WritePortFile(options.network.metrics_port_file, metrics->port());
  }
  spdlog::info("{}", LoadCudaSupport());
  absl::StatusOr<GraphBackend*> graph_backend = LoadCudaGraphBackend();
  spdlog::info("CUDA graphs: {}", !options.models.cuda_graphs ? std::string("off (--cuda-graphs=false)")
                                  : graph_backend.ok()        ? std::string("backend loaded")
                                                       : absl::StrCat("none (", graph_backend.status().message(), ")"));
  ConfigureThreads(options);
  ServingConfig defaults;
  defaults.device = options.models.device;
  defaults.format = *ParseModelFormat(options.models.format);  // checked by the flag
  defaults.instances = options.threads.instances;
  defaults.max_queued_texts = options.limits.max_queued_texts;
  defaults.cuda_graphs.enabled = options.models.cuda_graphs;
  // Set once the repository and then the gRPC server exist; the repository's threads read them.
  std::atomic<const ModelRepository*> repository_ptr{nullptr};
  std::atomic<grpc::HealthCheckServiceInterface*> health_ptr{nullptr};
  ModelRepository::Options repo_options;
  repo_options.root = options.models.store;
  repo_options.defaults = defaults;
  repo_options.version_policy = *VersionPolicy::Parse(options.models.version_policy);  // checked by the flag
  repo_options.observer = metrics.get();
  repo_options.load_timeout = absl::Seconds(options.models.load_timeout_seconds);
  repo_options.load_threads = options.models.load_threads;
  if (graph_backend.ok()) {
    repo_options.graph_backend = *graph_backend;
  } else {
    repo_options.graph_backend_note = std::string(graph_backend.status().message());
  }
  repo_options.listener = [&repository_ptr, &health_ptr, &metrics](const std::string& name, const VersionStatus& v) {
    LogModelEvent(name, v);
    if (metrics) metrics->OnModelEvent(name, v);
    const ModelRepository* repo = repository_ptr.load();
    grpc::HealthCheckServiceInterface* health = health_ptr.load();
    if (repo != nullptr && health != nullptr) PublishModelHealth(health, *repo, name);
  };
  auto repository = ModelRepository::Create(repo_options);
  if (!repository.ok()) {
    spdlog::critical("{}", std::string(repository.status().message()));
    return 1;
  }
  repository_ptr = repository->get();
  spdlog::info("loading models from {} (device {}, version policy {})", options.models.store, options.models.device,
               options.models.version_policy);
  (*repository)->Poll();

  Executor executor(options.threads.inference, options.limits.max_queued);
  RequestLimits limits;
  limits.max_texts = options.limits.max_texts;
  limits.max_text_bytes = options.limits.max_text_bytes;
  limits.inline_prepare_bytes = options.threads.inline_prepare_bytes;
  limits.max_response_bytes = options.network.max_message_bytes;
  InferenceService core(repository->get(), &executor, limits);
  InferCalls calls(repository->get(), {options.logging.access_log, metrics.get(),
                                       options.limits.max_inflight_request_bytes, options.network.max_message_bytes});
  InferenceServiceImpl service(&core, repository->get(), &calls);
  // The Open Inference Protocol beside it; its ServerReady follows the overall health status.
  std::atomic<bool> serving{false};
  OipServiceImpl oip(&core, repository->get(), &calls, &serving);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's built-in health service carries no descriptor of its own, so reflection lists
  // grpc.health.v1.Health but cannot describe it and grpcurl refuses to call it. Touching the
  // generated health.proto links its descriptor into the server, where reflection finds it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address = options.network.host + ":" + std::to_string(options.network.port);
  builder.AddListeningPort(address, ServerCredentials(options.tls), &port);
  builder.SetMaxReceiveMessageSize(options.network.max_message_bytes);
  builder.SetMaxSendMessageSize(options.network.max_message_bytes);
  const auto ms = [](double seconds) { return static_cast<int>(seconds * 1000); };
  grpc::ResourceQuota quota("qvi-server");
  quota.Resize(static_cast<size_t>(options.network.grpc_memory_quota_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.network.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options.network.keepalive_time_seconds));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(options.network.keepalive_timeout_seconds));
  // Keepalive enforcement: clients may ping without calls, but not more often than the interval; the
  // second ping too early ends their connection (GOAWAY too_many_pings).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             ms(options.network.min_client_ping_interval_seconds));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  if (options.network.max_connection_idle_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(options.network.max_connection_idle_seconds));
  }
  if (options.network.max_connection_age_seconds > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(options.network.max_connection_age_seconds));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               ms(options.network.max_connection_age_grace_seconds));
  }
  builder.RegisterService(&service);
  builder.RegisterService(&oip);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}", address);
    return 1;
  }
  health_ptr = server->GetHealthCheckService();
  PublishHealth(server->GetHealthCheckService(), **repository);
  serving = true;
  if (options.models.poll_seconds > 0) {
    (*repository)->StartPolling(absl::Milliseconds(static_cast<int64_t>(options.models.poll_seconds * 1000)));
  }
  size_t ready = 0, total = 0;
  for (const ModelStatus& m : (*repository)->List()) {
    for (const VersionStatus& v : m.versions) {
      ++total;
      ready += v.state == ModelState::kReady;
    }
  }
  const std::string transport = options.tls.cert.empty()        ? "plain text"
                                : options.tls.client_ca.empty() ? "TLS"
                                                                : "mutual TLS";
  spdlog::info(
      "serving qvi.serving.v1.Inference and inference.GRPCInferenceService (OIP v2) on {}:{} over {} ({} of {} model "
      "versions ready, {} request "
      "threads, {} instance(s) per model, torch {} intra-op thread(s))",
      options.network.host, port, transport, ready, total, options.threads.inference, options.threads.instances,
      options.threads.torch_intra);
  if (!options.network.port_file.empty()) WritePortFile(options.network.port_file, port);

  const int sig = WaitForSignal(signals);
  spdlog::info("received signal {}: reporting NOT_SERVING, finishing accepted requests (grace {} s)", sig,
               options.shutdown_grace_seconds);
  serving = false;
  server->GetHealthCheckService()->Shutdown();
  if (options.shutdown_delay_seconds > 0) {
    spdlog::info("NOT_SERVING for {} s while still taking calls", options.shutdown_delay_seconds);
    WaitForSignalOrTimeout(signals, options.shutdown_delay_seconds);
  }
  const auto grace = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_grace_seconds * 1000));
  // gRPC stops accepting and gives the calls in flight until the grace period ends; then the request
  // threads and every version's batch queue drain. gRPC's callback server waits for every call to be
  // answered, and a call is answered when its batch ends, so a forward pass that never ends (a hung
  // model or device) would keep the process alive: the whole sequence gets until kDrainAllowance
  // after the grace period, then the process exits 1 without it.
  constexpr auto kDrainAllowance = std::chrono::seconds(2);
  std::promise<void> drained;
  std::future<void> drained_future = drained.get_future();
  std::thread drain = Env::Default()->StartThread("qvi-drain", [&] {
    server->Shutdown(grace);
    spdlog::debug("gRPC server shut down");
    executor.Shutdown();
    spdlog::debug("request threads drained");
    (*repository)->Shutdown();
    spdlog::debug("model queues drained, models unloaded");
    drained.set_value();
  });
  if (drained_future.wait_until(grace + kDrainAllowance) != std::future_status::ready) {
    spdlog::error(
        "shutdown had not finished {} s after the grace period ended (a call or a batch still "
        "running: a hung model?); exiting without it",
        std::chrono::duration_cast<std::chrono::seconds>(kDrainAllowance).count());
    FlushLogsNow();  // not the access queue: stderr may be what is stuck
    std::_Exit(1);
  }
  drain.join();
  server->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace qvi

#ifdef QVI_WITH_JEMALLOC
// jemalloc's start-up options, read from this symbol of the executable (MALLOC_CONF in the
// environment overrides them): a background thread returns dirty pages to the system as they age,
// not only when some thread next allocates. The 30-minute soak measured this setting
// (docs/serving.md "Soak").
extern "C" {
const char* malloc_conf = "background_thread:true";
}
#endif

int main(int argc, char** argv) {
  // Block the shutdown signals in every thread (they inherit this mask); the main thread takes them
  // with sigwait, so no handler runs in an arbitrary thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A handler besides the mask: as a container's PID 1 the process would otherwise not be sent
  // SIGTERM at all (the kernel drops signals that PID 1 leaves at their default action). Never runs:
  // the signals stay blocked and sigwait takes them.
  struct sigaction noop = {};
  noop.sa_handler = [](int) {};
  sigaction(SIGTERM, &noop, nullptr);
  sigaction(SIGINT, &noop, nullptr);

  absl::StatusOr<qvi::ServerOptions> options = qvi::ParseServerOptions(argc, argv);
  if (!options.ok()) {
    const bool info = options.status().code() == absl::StatusCode::kCancelled;
    (info ? std::cout : std::cerr) << options.status().message();
    return info ? 0 : 2;
  }
  const int code = qvi::Run(*options, signals);
  qvi::ShutdownLogging();
  return code;
}
