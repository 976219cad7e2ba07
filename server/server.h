// The server as one object that owns its parts, started and drained in named steps: metrics, the
// CUDA backend and the model store (the first poll), the request threads and the core, the gRPC
// server with both APIs, health; then, on the signal main() waits for, NOT_SERVING, the grace
// period and the drain. main.cc only parses options, blocks signals and calls these.
#ifndef QVI_SERVER_SERVER_H_
#define QVI_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/model/graphs.h"
#include "server/core/repository/model_repository.h"
#include "server/core/sched/executor.h"
#include "server/core/serving/cpu_budget.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/shadow.h"
#include "server/frontend/call.h"
#include "server/frontend/core.h"
#include "server/frontend/decision_log.h"
#include "server/frontend/oip/api.h"
#include "server/grpc/native/native_service.h"
#include "server/grpc/oip/oip_service.h"
#include "server/grpc/oip/repository_service.h"
#include "server/grpc/reflection_service.h"
#include "server/grpc/tei/tei_service.h"
#include "server/http/http_api.h"
#include "server/http/http_server.h"
#include "server/metrics/metrics.h"
#include "server/server_options.h"
#include "server/tls/tls_credentials.h"
#include "server/tracing/otlp_exporter.h"
#include "server/tracing/tracing_observer.h"

namespace qvi {

class Server {
 public:
  explicit Server(ServerOptions options) : options_(std::move(options)) {}
  ~Server();

  // Starts every part and returns once the server listens and the store's first poll is done; the
  // error says which part could not start, or CANCELLED after Abort().
  absl::Status Start();

  // From another thread while Start() runs (a signal during start-up): abandons the loads in
  // progress and makes Start() return CANCELLED soon, whatever part it is in; the models already
  // loaded are unloaded. Call once; Drain() is not called afterwards.
  void Abort();

  // The model loads abandoned whose threads still run ("name@version (running for 3s)"); the
  // process must not wait for them on its way out.
  std::vector<std::string> LoadsStillRunning() const;

  // SIGHUP: reads the --api-keys file again (a bad file keeps the keys in use and says why).
  void Reload();

  int port() const { return port_; }
  int http_port() const { return http_port_; }  // 0 when the HTTP port is off

  // After SIGTERM/SIGINT: reports NOT_SERVING, keeps taking calls for --shutdown-delay-seconds (or
  // until the next of `signals`), then lets the calls in flight finish within the grace period and
  // drains the request threads and the models' queues. Returns the exit code: 0, or 1 when a call
  // or batch was still running kDrainAllowance after the grace period (the process must then exit
  // at once, without destructors: this object is left as it is).
  int Drain(int signal, const sigset_t& signals);

 private:
  absl::Status StartMetrics();
  absl::Status StartModels();
  // After the first poll: the request threads, the response cache and the core the front ends call.
  void StartCore();
  absl::Status StartTls();
  absl::Status StartApiKeys();            // server_security.cc, as StartTls
  absl::Status StartTracing();            // server_tracing.cc: --otlp-endpoint's exporter and batch spans
  absl::Status StartDecisionLog();        // server_decisions.cc: --decision-log
  absl::Status StartDecisionLogExport();  // and --decision-log-otlp-endpoint
  // server_decisions.cc: the core's shadow mirror and drift gauges, the decision log's redaction through the core.
  void StartRecorders();
  // server_services.cc: every gRPC service, and the reflection that lists them.
  void MakeGrpcServices();
  absl::Status StartGrpc();
  absl::Status StartHttp();
  void LogServing() const;

  ServerOptions options_;
  std::unique_ptr<Metrics> metrics_;
  // Before everything that exports spans (the calls, the repository's runners): destroyed after them.
  std::unique_ptr<OtlpExporter> otlp_;
  std::shared_ptr<OtlpLogExporter> decision_otlp_;  // --decision-log-otlp-endpoint; the decision log's sink holds it
  std::unique_ptr<TracingObserver> tracing_;        // the repository's observer when spans are exported
  absl::StatusOr<GraphBackend*> graph_backend_ = nullptr;
  // Set once the repository and then the gRPC server exist; the repository's threads read them.
  std::atomic<ModelRepository*> repository_ptr_{nullptr};
  std::atomic<bool> aborted_{false};
  std::atomic<grpc::HealthCheckServiceInterface*> health_ptr_{nullptr};
  // Declared before the repository, so destroyed after it: its runners hand answers to it.
  std::unique_ptr<Executor> answers_;
  std::unique_ptr<ModelRepository> repository_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ResponseCache> cache_;   // --response-cache-bytes; outlives core_, which uses it
  std::unique_ptr<CpuHeadroom> headroom_;  // outlives shadow_, which asks it (--shadow-max-cpu-busy)
  std::unique_ptr<ShadowMirror> shadow_;   // outlives core_, which mirrors through it
  std::unique_ptr<DriftMonitor> drift_;    // --drift-window-texts; outlives core_, which observes through it
  std::unique_ptr<InferenceService> core_;
  std::unique_ptr<ServingCore> frontend_core_;  // what the front ends call core_ through
  std::shared_ptr<ApiKeys> api_keys_;           // before calls_, which reads it
  // Before calls_, which writes to it; shared with the scrapes of /metrics, which may come during teardown.
  std::shared_ptr<DecisionLog> decisions_;
  std::unique_ptr<Calls> calls_;
  std::unique_ptr<OipApi> oip_api_;
  std::unique_ptr<InferenceServiceImpl> service_;
  std::unique_ptr<OipServiceImpl> oip_;
  std::unique_ptr<OipRepository> oip_repository_;          // OIP's repository extension (model control)
  std::unique_ptr<RepositoryService> repository_service_;  // ... over gRPC, by method name
  std::unique_ptr<TeiGrpc> tei_;                           // TEI's gRPC services (tei.v1), and what they share
  std::unique_ptr<TeiInfoService> tei_info_;
  std::unique_ptr<TeiPredictService> tei_predict_;
  std::unique_ptr<TeiTokenizeService> tei_tokenize_;
  std::unique_ptr<ReflectionV1> reflection_;
  std::unique_ptr<ReflectionV1Alpha> reflection_alpha_;
  std::atomic<bool> serving_{false};              // OIP's ServerReady follows the overall health status
  std::shared_ptr<ReloadingTlsCredentials> tls_;  // before server_: gRPC asks it until server_ is gone
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Last: destroyed first, while the core its calls answer through still exists.
  std::unique_ptr<HttpApi> http_api_;
  std::unique_ptr<HttpServer> http_;
  int http_port_ = 0;
};

}  // namespace qvi

#endif  // QVI_SERVER_SERVER_H_
