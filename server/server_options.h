// qvi-server's options, grouped by concern, and the parser that fills them from the command line
// and an optional config file.
#ifndef QVI_SERVER_SERVER_OPTIONS_H_
#define QVI_SERVER_SERVER_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/sched/defaults.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace qvi {

struct ServerOptions {
  struct Models {
    std::string store = "model_store/store";
    std::string device = "auto";
    std::string format = "auto";
    std::string cpu_package = "auto";
    std::string version_policy = "latest:1";   // for models whose serving.json names none
    double poll_seconds = 2;                   // 0: read the store once, at start-up
    double load_timeout_seconds = 600;         // a version's load and warm-up, at most; then FAILED
    int load_threads = 4;                      // models loaded at once
    bool cuda_graphs = defaults::kCudaGraphs;  // models on a GPU capture CUDA graphs at load
    std::string model_control = "poll";        // poll: the store's models; explicit: loaded over the wire
    std::vector<std::string> load_models;      // explicit: the models loaded at start-up ("*": all)
    std::string device_memory_budget;          // bytes or a fraction per device (memory_budget.h); "": none
    std::string unload_idle_after = "0";       // a duration ("10m", or seconds); 0: never
    bool load_on_demand = false;               // a request for a model not loaded loads it
    int max_waiting_loads = 8;                 // models loading on demand at once; more are refused
    int64_t response_cache_bytes = 0;          // per-text answers kept (response_cache.h); 0: no cache
    std::string default_model;                 // the model of routes that name none (TEI's); "": the only one
  } models;
  struct Network {
    std::string host = "0.0.0.0";
    int port = 8500;
    std::string port_file;  // written with the bound port once serving (useful with --port 0)
    int max_message_bytes = 16 * 1024 * 1024;
    // A gRPC call's metadata (HPACK's count): over it, the call alone is refused. The transport's own
    // limit, over which gRPC 1.51 resets the whole connection, is kept far above (TransportMetadataBytes).
    int max_metadata_bytes = 8 * 1024;
    int metrics_port = 8502;        // Prometheus /metrics; 0 picks a free port, -1 turns metrics off
    std::string metrics_port_file;  // written with the bound metrics port
    // HTTP/JSON (server/http/http_api.h); 0 picks a free port, -1 turns it off.
    int http_port = 8501;
    std::string http_port_file;  // written with the bound HTTP port
    int http_threads = 0;        // threads running every HTTP connection (event-driven); 0: one per usable CPU
    double http_header_timeout_seconds = 10;
    double http_idle_timeout_seconds = 75;
    int http_max_header_bytes = 16384;
    std::vector<std::string> http_cors_allow_origins;  // origins browsers may call the HTTP port from
    bool http_explain_page = true;                     // GET / on the HTTP port: the explanation page
    // A connection older than this is sent GOAWAY (its calls in flight get the grace to finish), so
    // that long-lived clients reconnect and spread over replicas added since. 0: no limit.
    double max_connection_age_seconds = 0;
    double max_connection_age_grace_seconds = 30;
    // gRPC's own resource limits (see --help).
    int64_t grpc_memory_quota_bytes = int64_t{1} << 30;
    int max_concurrent_streams = 128;
    double max_connection_idle_seconds = 900;
    double keepalive_time_seconds = 60;
    double keepalive_timeout_seconds = 20;
    double min_client_ping_interval_seconds = 10;
  } network;
  struct Tls {
    std::string cert;         // PEM certificate chain of the server; with key, the gRPC port speaks TLS only
    std::string key;          // PEM private key
    std::string client_ca;    // PEM CA bundle; when set, clients must present a certificate it signed (mTLS)
    int reload_seconds = 60;  // the three files are read again this often: a renewed certificate is used
  } tls;
  struct Auth {
    std::string api_keys;      // the key file (server/auth/api_keys.h); empty: no key is asked for
    int reload_seconds = 10;   // the file is looked at this often (and read again on SIGHUP)
    bool allow_empty = false;  // a file with no keys is taken (every call refused), not refused as a mistake
  } auth;
  struct Limits {
    int max_texts = 256;
    int max_text_bytes = 65536;
    // options.occlusion: Σ n·(n − 1) tokens of a request's leave-one-out variants (RequestLimits).
    int64_t max_occlusion_tokens = 131072;
    int max_queued = 1024;     // requests waiting for a request thread
    int max_queued_texts = 0;  // texts waiting in one model version's batch queue; 0: by device (defaults.h)
    int64_t max_inflight_request_bytes = int64_t{256}
                                         << 20;  // inference request bytes (Classify, Tag, ModelInfer) not yet answered
    int max_stream_inflight = 64;        // a stream's requests read and not yet answered (ClassifyStream, TagStream)
    int shadow_max_inflight_texts = 64;  // texts mirrored to shadow candidates in the core at once
    double shadow_max_cpu_busy = 0.5;    // mirror only while the process's CPU is busy less than this share
  } limits;
  struct Threads {
    int inference = 2;                    // request threads: check and tokenise, then queue for the model
    int answers = -1;                     // answer threads (ModelRunner): -1 one per usable CPU, 0 none
    bool pipeline = true;                 // the next batch launched before the last is collected (a GPU)
    int64_t inline_prepare_bytes = 4096;  // smaller requests are prepared on the gRPC thread instead
    int instances = 0;                    // model instance threads per model version; 0: from the CPUs (PlanThreads)
    int torch_intra = 0;                  // torch intra-op threads per forward pass; 0: from the CPUs (PlanThreads)
    int torch_inter = 1;
    bool sched_batch = true;  // every thread under SCHED_BATCH (server/core/sched/cpu_policy.h)
  } threads;
  struct Logging {
    std::string level = "info";
    std::string format = "text";  // or "json": one JSON object per line
    bool access_log = false;
    int64_t access_log_queue = 8192;  // lines queued for stderr; beyond it the oldest are dropped
    double trace_rate = 0;            // calls without a traceparent whose timings are logged (0 to 1)
  } logging;
  struct Tracing {              // OpenTelemetry spans (server_tracing.cc, server/tracing/)
    std::string otlp_endpoint;  // http://host:port[/path]; empty: no spans
    double sampling_ratio = 1.0;
    std::string service_name = "qvi-server";
    std::string resource_attributes;  // key=value,key=value
    int queue_spans = 2048;
    double timeout_seconds = 5;
  } tracing;
  struct Decisions {   // the decision log (server_decisions.cc, server/frontend/decision_log.h)
    std::string path;  // empty: none
    double rate = 1.0;
    std::vector<std::string> model_rates, key_rates;  // NAME=RATE
    int64_t max_bytes = int64_t{64} << 20;
    int keep = 5;
    bool texts = false;
    int queue_lines = 4096;
    std::string otlp_endpoint;  // OTLP/HTTP logs; empty: none
    std::string redact_with;    // a tagger that masks the texts; empty: none
    std::vector<std::string> redact_types{"PER", "LOC", "ORG"};
    int drift_window_texts = 1000;  // the drift gauges' window per model version (serving/drift.h); 0: none
  } decisions;
  double shutdown_grace_seconds = 30;
  // On SIGTERM/SIGINT: health reads NOT_SERVING this long while calls are still taken, so that a
  // load balancer (a Kubernetes readiness probe) stops routing here before the server refuses calls.
  double shutdown_delay_seconds = 0;
};

// Parses argv. Returns the options, or a status whose message is the text to print: for --help and
// --version the code is kCancelled (print, exit 0); for bad flags kInvalidArgument (print, exit 2).
absl::StatusOr<ServerOptions> ParseServerOptions(int argc, char** argv);

// CLI::Range(min, max) for a flag's number that also refuses "nan" and "inf" (CLI::Range lets NaN through:
// every comparison with it is false).
CLI::Validator FiniteRange(double min, double max);

// The Tracing group's flags (server_tracing.cc).
void AddTracingOptions(CLI::App& app, ServerOptions& o);
// The Decision log group's flags and --drift-window-texts (server_decisions.cc).
void AddDecisionLogOptions(CLI::App& app, ServerOptions& o);

// --unload-idle-after: "10m", "90s" (absl::ParseDuration) or a number of seconds; 0 to a year.
absl::StatusOr<absl::Duration> ParseIdleDuration(const std::string& text);

}  // namespace qvi

#endif  // QVI_SERVER_SERVER_OPTIONS_H_
