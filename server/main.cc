// qvi-server: parse options, load the model store, serve qvi.serving.v1.Inference with health and
// reflection, and on SIGTERM/SIGINT drain and exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "server/core/executor.h"
#include "server/core/inference_service.h"
#include "server/core/model_repository.h"
#include "server/grpc/inference_service_impl.h"
#include "server/server_options.h"

namespace qvi {
namespace {

void ConfigureTorch(const ServerOptions::Threads& t) {
  torch::set_num_threads(t.torch_intra);
  torch::set_num_interop_threads(t.torch_inter);
}

void LogLoad(const std::string& name, const VersionStatus& v) {
  if (v.state == ModelState::kReady) {
    const Manifest& m = v.model->manifest();
    const ServingConfig& c = v.serving;
    spdlog::info("model {}@{} READY: {} ({}) on {}, {} labels/tags, max_tokens {}; batches of up to {} texts / {} "
                 "tokens / {} ms, {} instance(s)",
                 name, v.version, m.display_name, m.task == Task::kClassification ? "classification" : "tagging",
                 v.model->device(), m.task == Task::kClassification ? m.labels.size() : m.tags.size(),
                 m.tokenizer.max_tokens, c.max_batch_size, c.max_batch_tokens, c.max_queue_delay_ms, c.instances);
  } else {
    spdlog::error("model {}@{} {}: {}", name, v.version, ModelStateName(v.state), v.reason);
  }
}

// Health: overall SERVING once the store is loaded; per model (service name = model name)
// SERVING when it has a ready version.
void PublishHealth(grpc::Server& server, const ModelRepository& repository) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  for (const ModelStatus& m : repository.List()) {
    bool ready = false;
    for (const VersionStatus& v : m.versions) ready = ready || v.state == ModelState::kReady;
    health->SetServingStatus(m.name, ready);
  }
  health->SetServingStatus(true);
}

int WaitForSignal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

int Run(const ServerOptions& options, const sigset_t& signals) {
  spdlog::set_level(spdlog::level::from_str(options.logging.level));
  ConfigureTorch(options.threads);
  ServingConfig defaults;
  defaults.device = options.models.device;
  defaults.instances = options.threads.instances;
  defaults.max_queued_texts = options.limits.max_queued_texts;
  auto repository = ModelRepository::Create({options.models.store, defaults});
  if (!repository.ok()) {
    spdlog::critical("{}", std::string(repository.status().message()));
    return 1;
  }
  spdlog::info("loading models from {} (device {})", options.models.store, options.models.device);
  (*repository)->LoadAll(LogLoad);

  Executor executor(options.threads.inference, options.limits.max_queued);
  InferenceService core(repository->get(), &executor,
                        RequestLimits{options.limits.max_texts, options.limits.max_text_bytes});
  InferenceServiceImpl service(&core, repository->get(), {options.logging.access_log});

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address = options.network.host + ":" + std::to_string(options.network.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.network.max_message_bytes);
  builder.SetMaxSendMessageSize(options.network.max_message_bytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}", address);
    return 1;
  }
  PublishHealth(*server, **repository);
  size_t ready = 0, total = 0;
  for (const ModelStatus& m : (*repository)->List()) {
    for (const VersionStatus& v : m.versions) {
      ++total;
      ready += v.state == ModelState::kReady;
    }
  }
  spdlog::info("serving qvi.serving.v1.Inference on {}:{} ({} of {} model versions ready, {} request threads, "
               "{} instance(s) per model, torch {} intra-op thread(s))",
               options.network.host, port, ready, total, options.threads.inference, options.threads.instances,
               options.threads.torch_intra);
  if (!options.network.port_file.empty()) {
    const std::string tmp = options.network.port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), options.network.port_file.c_str());
  }

  const int sig = WaitForSignal(signals);
  spdlog::info("received signal {}: reporting NOT_SERVING, finishing accepted requests (grace {} s)", sig,
               options.shutdown_grace_seconds);
  server->GetHealthCheckService()->Shutdown();
  const auto grace = std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_grace_seconds * 1000));
  server->Shutdown(grace);  // stops accepting; waits for in-flight RPCs until the grace period ends
  spdlog::debug("gRPC server shut down");
  executor.Shutdown();
  spdlog::debug("request threads drained");
  core.Shutdown();
  spdlog::debug("model queues drained");
  server->Wait();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace qvi

int main(int argc, char** argv) {
  // Block the shutdown signals in every thread (they inherit this mask); the main thread takes them
  // with sigwait, so no handler runs in an arbitrary thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<qvi::ServerOptions> options = qvi::ParseServerOptions(argc, argv);
  if (!options.ok()) {
    const bool info = options.status().code() == absl::StatusCode::kCancelled;
    (info ? std::cout : std::cerr) << options.status().message();
    return info ? 0 : 2;
  }
  return qvi::Run(*options, signals);
}
