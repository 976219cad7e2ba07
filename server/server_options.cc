#include "server/server_options.h"

#include <CLI/CLI.hpp>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/repository/memory_budget.h"
#include "server/core/sched/defaults.h"
#include "server/tls/tls_credentials.h"

namespace qvi {

CLI::Validator FiniteRange(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& input) -> std::string {
        double value = 0;
        if (absl::SimpleAtod(input, &value) && std::isfinite(value) && value >= min && value <= max) return "";
        return absl::StrCat("'", input, "' is not a number from ", min, " to ", max);
      },
      absl::StrCat("FLOAT in [", min, " - ", max, "]"));
}

namespace {

// The model store: where versions come from, how they load, which are served.
void AddModelOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--model-store", o.models.store,
                 "folder of <model>/<version>/ artifacts (model.pt, model.cpu.pt2, model.cuda.pt2)")
      ->group("Models");
  app.add_option("--device", o.models.device, "auto (GPU when present), cpu, cuda or cuda:N")->group("Models");
  app.add_option("--model-format", o.models.format,
                 "artifact to load from a version folder unless its serving.json says otherwise: auto (the .pt2 "
                 "compiled for the device when it can run here, else model.pt), torchscript or pt2")
      ->check(CLI::IsMember({"auto", "torchscript", "pt2"}))
      ->group("Models");
  app.add_option("--cpu-package", o.models.cpu_package,
                 "CPU package to load from a version folder unless its serving.json says otherwise: auto (the "
                 "first of model.cpu.x86-64-v4-int8.pt2, model.cpu.x86-64-v4-bf16.pt2, model.cpu.x86-64-v4.pt2 "
                 "and model.cpu.pt2 that the folder holds and this CPU runs), x86-64-v4-int8, x86-64-v4-bf16, "
                 "x86-64-v4 or base (model.cpu.pt2)")
      ->check([](const std::string& name) {
        absl::Status s = CheckCpuPackage(name);
        return s.ok() ? std::string() : std::string(s.message());
      })
      ->group("Models");
  app.add_option("--cuda-graphs", o.models.cuda_graphs,
                 "models on a GPU replay CUDA graphs captured at load, one per batch-size and length bucket, "
                 "unless their serving.json says \"cuda_graphs\": false (docs/performance.md)")
      ->group("Models");
  app.add_option("--default-model", o.models.default_model,
                 "the model that the routes naming none answer from (TEI's /predict, /, /info); unset: the store's "
                 "only model (with several, those routes say to name one: /models/{m}/predict)")
      ->group("Models");
  app.add_option("--model-control", o.models.model_control,
                 "poll: serve every model of the store, loading and unloading them as their folders come and go; "
                 "explicit: serve the models --load-model names and those an admin loads over the wire (OIP's "
                 "repository extension, docs/serving.md \"Model control\")")
      ->check(CLI::IsMember({"poll", "explicit"}))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--load-model", o.models.load_models,
                 "with --model-control explicit: a model to load at start-up (repeat it for more; * for every "
                 "model of the store)")
      ->group("Models");
  app.add_option("--version-policy", o.models.version_policy,
                 "versions served per model unless its serving.json says otherwise: latest:N, all, specific:V1,V2")
      ->check([](const std::string& spec) {
        absl::StatusOr<VersionPolicy> p = VersionPolicy::Parse(spec);
        return p.ok() ? std::string() : std::string(p.status().message());
      })
      ->group("Models");
  app.add_option("--poll-store-seconds", o.models.poll_seconds,
                 "how often to look for new, changed and removed versions; 0 reads the store only at start-up")
      ->check(FiniteRange(0.0, 86400.0))
      ->group("Models");
  app.add_option("--model-load-timeout-seconds", o.models.load_timeout_seconds,
                 "a version whose load and warm-up take longer is abandoned and FAILED (retried when its files change)")
      ->check(FiniteRange(0.001, 86400.0))
      ->group("Models");
  app.add_option("--model-load-threads", o.models.load_threads,
                 "models loaded at once, so that one slow or stuck model holds up no other")
      ->check(CLI::Range(1, 64))
      ->group("Models");
}

// Memory: the budget per device, idle models, loads on demand, and the response cache.
void AddMemoryOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--device-memory-budget", o.models.device_memory_budget,
                 "memory the loaded versions may take on each device: bytes (24GiB, 512MB) or a fraction of the "
                 "device (0.8, 80%); a load that would pass it first unloads models, least recently used first, "
                 "idle ones before busy ones, which finish their requests first (docs/serving.md \"Memory "
                 "budget\"). Unset: no budget")
      ->check([](const std::string& text) {
        absl::StatusOr<MemoryBudget> b = ParseMemoryBudget(text);
        return b.ok() ? std::string() : std::string(b.status().message());
      })
      ->group("Models");
  app.add_option("--unload-idle-after", o.models.unload_idle_after,
                 "unload a model no request has asked for in this long (10m, 90s, or seconds); it loads again on "
                 "demand (--load-on-demand) or when an admin loads it. 0: never")
      ->check([](const std::string& text) {
        absl::StatusOr<absl::Duration> d = ParseIdleDuration(text);
        return d.ok() ? std::string() : std::string(d.status().message());
      })
      ->capture_default_str()
      ->group("Models");
  app.add_flag("--load-on-demand", o.models.load_on_demand,
               "a request for a model of the store that is not loaded (unloaded for memory or idleness, or not yet "
               "loaded with --model-control explicit) loads it and waits, within its deadline")
      ->group("Models");
  app.add_option("--max-waiting-loads", o.models.max_waiting_loads,
                 "models that may be loading on demand at once (each for however many requests wait for it); a "
                 "request for another model not loaded is refused at once (RESOURCE_EXHAUSTED)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str()
      ->group("Models");
  app.add_option("--response-cache-bytes", o.models.response_cache_bytes,
                 "keep each text's answer, up to this many bytes in all (least recently used out first), and answer "
                 "the same text asked again with the same options from it, without the model; keyed by model, the "
                 "version loaded and the options, so a new version never serves an old answer. 0: no cache")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->group("Models");
}

// The HTTP/JSON port (server/http/).
void AddHttpOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--http-port", o.network.http_port,
                 "HTTP/JSON port (health, models, :classify and :tag; docs/serving.md); 0 picks a free port, -1 "
                 "turns it off. With --tls-cert it speaks HTTPS only, with the gRPC port's files")
      ->check(CLI::Range(-1, 65535))
      ->group("Network");
  app.add_option("--http-port-file", o.network.http_port_file, "write the bound HTTP port to this file")
      ->group("Network");
  app.add_option("--http-threads", o.network.http_threads,
                 "threads running every HTTP connection; an idle keep-alive connection holds none. 0: one per "
                 "usable CPU (two threads degraded at 1,024 connections on 16 cores)")
      ->check(CLI::Range(0, 256))
      ->group("Network");
  app.add_option("--http-header-timeout-seconds", o.network.http_header_timeout_seconds,
                 "a request's header must arrive within this long of its first byte, else the connection is closed")
      ->check(FiniteRange(0.1, 3600.0))
      ->group("Network");
  app.add_option("--http-idle-timeout-seconds", o.network.http_idle_timeout_seconds,
                 "an HTTP keep-alive connection without a request for this long is closed")
      ->check(FiniteRange(0.1, 86400.0))
      ->group("Network");
  app.add_option("--http-max-header-bytes", o.network.http_max_header_bytes,
                 "largest HTTP request header (431 beyond); the body's limit is --max-message-bytes (413)")
      ->check(CLI::Range(1024, 1 << 20))
      ->group("Network");
  app.add_option("--http-cors-allow-origin", o.network.http_cors_allow_origins,
                 "an origin (scheme://host[:port]) whose web pages may call the HTTP port (CORS); repeat for more, "
                 "'*' for any. None: browsers' cross-origin calls are refused")
      ->group("Network");
  app.add_option("--http-explain-page", o.network.http_explain_page,
                 "serve the explanation page at / on the HTTP port: pick a model, type a text, see its answer with "
                 "alpha, beta and each layer's maps (docs/serving.md); false: / is 404")
      ->group("Network");
}

// The gRPC and metrics ports, message sizes and connection management.
void AddNetworkOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--host", o.network.host, "address to listen on")->group("Network");
  app.add_option("--port", o.network.port, "gRPC port; 0 picks a free port and logs it")
      ->check(CLI::Range(0, 65535))
      ->group("Network");
  app.add_option("--port-file", o.network.port_file, "write the bound gRPC port to this file once serving")
      ->group("Network");
  app.add_option("--metrics-port", o.network.metrics_port,
                 "Prometheus metrics at http://HOST:PORT/metrics; 0 picks a free port, -1 turns metrics off")
      ->check(CLI::Range(-1, 65535))
      ->group("Network");
  app.add_option("--metrics-port-file", o.network.metrics_port_file, "write the bound metrics port to this file")
      ->group("Network");
  app.add_option("--max-message-bytes", o.network.max_message_bytes, "largest request or response message")
      ->check(CLI::Range(1024, 1 << 30))
      ->group("Network");
  app.add_option("--max-metadata-bytes", o.network.max_metadata_bytes,
                 "largest gRPC call metadata (each entry's key and value, and 32 bytes): a call over it is refused "
                 "alone (RESOURCE_EXHAUSTED); the transport resets a connection only past 256 KiB or 4 times this "
                 "(docs/security.md)")
      ->check(CLI::Range(1024, 4 << 20))
      ->capture_default_str()
      ->group("Network");

  app.add_option("--max-connection-age-seconds", o.network.max_connection_age_seconds,
                 "close client connections after this long (GOAWAY, then the client reconnects), so that clients "
                 "rebalance over replicas added since they connected; gRPC adds +/-10% jitter. 0: never")
      ->check(FiniteRange(0.0, 7.0 * 86400))
      ->group("Network");
  app.add_option("--max-connection-age-grace-seconds", o.network.max_connection_age_grace_seconds,
                 "after a connection's GOAWAY, time its calls in flight get to finish before it is closed")
      ->check(FiniteRange(0.0, 86400.0))
      ->group("Network");

  app.add_option("--grpc-memory-quota-bytes", o.network.grpc_memory_quota_bytes,
                 "memory gRPC may use for its buffers (its resource quota); beyond it gRPC refuses new calls")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{1} << 40))
      ->group("Network");
  app.add_option("--max-concurrent-streams", o.network.max_concurrent_streams,
                 "calls one client connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); "
                 "more wait in the client")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Network");
  app.add_option("--max-connection-idle-seconds", o.network.max_connection_idle_seconds,
                 "close a client connection that had no call for this long (the client reconnects when it "
                 "next calls). 0: never")
      ->check(FiniteRange(0.0, 7.0 * 86400))
      ->group("Network");
  app.add_option("--keepalive-time-seconds", o.network.keepalive_time_seconds,
                 "ping a client connection that has been quiet this long, to find dead peers")
      ->check(FiniteRange(1.0, 7.0 * 86400))
      ->group("Network");
  app.add_option("--keepalive-timeout-seconds", o.network.keepalive_timeout_seconds,
                 "close the connection when a ping is not answered within this")
      ->check(FiniteRange(1.0, 3600.0))
      ->group("Network");
  app.add_option("--min-client-ping-interval-seconds", o.network.min_client_ping_interval_seconds,
                 "a client that pings more often than this gets GOAWAY (too_many_pings) after two such pings")
      ->check(FiniteRange(0.0, 86400.0))
      ->group("Network");
}

// TLS and mutual TLS on the gRPC port.
void AddTlsOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--tls-cert", o.tls.cert,
                 "PEM certificate (chain) of the gRPC port; with --tls-key it speaks TLS only")
      ->check(CLI::ExistingFile)
      ->group("TLS");
  app.add_option("--tls-key", o.tls.key, "PEM private key of --tls-cert")->check(CLI::ExistingFile)->group("TLS");
  app.add_option("--tls-client-ca", o.tls.client_ca,
                 "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
      ->check(CLI::ExistingFile)
      ->group("TLS");
  app.add_option("--tls-reload-seconds", o.tls.reload_seconds,
                 "read the certificate, key and client CA files again this often, so renewed ones take effect "
                 "for new connections without a restart")
      ->check(CLI::Range(1, 86400))
      ->group("TLS");
}

// API keys with scopes (docs/security.md, "API keys").
void AddAuthOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--api-keys", o.auth.api_keys,
                 "JSON file of API keys (name, SHA-256, scopes): every call but the probes must present one as "
                 "'authorization: Bearer KEY'; read again when it changes or on SIGHUP")
      ->check(CLI::ExistingFile)
      ->group("Security");
  app.add_flag("--api-keys-allow-empty", o.auth.allow_empty,
               "take an --api-keys file with no keys (every call but the probes refused) rather than refuse it as "
               "a mistake")
      ->group("Security");
  app.add_option("--api-keys-reload-seconds", o.auth.reload_seconds,
                 "look at the --api-keys file for changes this often")
      ->check(CLI::Range(1, 86400))
      ->group("Security");
}

// Request and queue limits.
void AddLimitOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--max-texts-per-request", o.limits.max_texts,
                 "texts in one Classify, Tag or ModelInfer request (also the cap on their repeated texts on the wire)")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Limits");
  app.add_option("--max-text-bytes", o.limits.max_text_bytes, "UTF-8 bytes in one text")
      ->check(CLI::Range(1, 1 << 30))
      ->group("Limits");
  app.add_option("--max-occlusion-tokens", o.limits.max_occlusion_tokens,
                 "tokens of one request's options.occlusion variants: sum of n*(n-1) over its texts of n tokens "
                 "(each text again without each token); 0 refuses occlusion")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->group("Limits");
  app.add_option("--max-queued-requests", o.limits.max_queued,
                 "requests waiting for a request thread; beyond it RESOURCE_EXHAUSTED")
      ->check(CLI::Range(1, 1 << 24))
      ->group("Limits");
  app.add_option(
         "--max-inflight-request-bytes", o.limits.max_inflight_request_bytes,
         "bytes of inference requests (Classify, Tag, ModelInfer) received and not yet answered, with their answers' "
         "estimated sizes; a call beyond it gets RESOURCE_EXHAUSTED, before it is parsed (its request) or queued "
         "(its answer). 0: no limit")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->group("Limits");
  app.add_option("--shadow-max-inflight-texts", o.limits.shadow_max_inflight_texts,
                 "texts mirrored to shadow candidates in the core at once; more are dropped and counted")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Limits");
  app.add_option("--max-stream-inflight", o.limits.max_stream_inflight,
                 "requests of one stream read and not yet answered; its next message is read only below it")
      ->check(CLI::Range(1, 1 << 16))
      ->group("Limits");
  app.add_option("--max-queued-texts", o.limits.max_queued_texts,
                 absl::StrCat("texts waiting in one model version's batch queue; beyond it RESOURCE_EXHAUSTED. 0: by "
                              "the version's device, ",
                              defaults::kMaxQueuedTexts, " on the CPU and ", defaults::kGpuMaxQueuedTexts, " on a GPU"))
      ->check(CLI::Range(0, 1 << 24))
      ->group("Limits");
}

// Request threads, model instances and torch threads.
void AddThreadOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--inference-threads", o.threads.inference,
                 "request threads: check and tokenise requests, then queue their texts for the model")
      ->check(CLI::Range(1, 256))
      ->group("Threads");
  app.add_option("--answer-threads", o.threads.answers,
                 "threads that turn each batch's outputs into answers and complete the requests, shared by every "
                 "model, so that a model's instance thread goes back to the next batch at once. -1: one per usable "
                 "CPU; 0: none, the instance threads answer their own batches")
      ->check(CLI::Range(-1, 256))
      ->group("Threads");
  app.add_option("--pipeline-batches", o.threads.pipeline,
                 "where the device computes on its own (a GPU), each instance thread launches the next batch before "
                 "it collects the last, so the device never waits for the host's work between batches; false: one "
                 "batch at a time (for comparison)")
      ->group("Threads");
  app.add_option("--inline-prepare-bytes", o.threads.inline_prepare_bytes,
                 "requests whose texts add up to fewer bytes are checked and tokenised on the gRPC thread that "
                 "received them (one hand-off less); larger ones on a request thread. 0: always a request thread")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->group("Threads");
  app.add_option("--instances-per-model", o.threads.instances,
                 "model instance threads per model version, each running one batch at a time. 0: chosen from "
                 "the CPUs this process may use (affinity and cgroup limit), logged at start-up")
      ->check(CLI::Range(0, 64))
      ->group("Threads");
  app.add_option("--torch-intra-op-threads", o.threads.torch_intra,
                 "torch threads inside one forward pass (per instance). 0: chosen with --instances-per-model")
      ->check(CLI::Range(0, 256))
      ->group("Threads");
  app.add_option("--torch-inter-op-threads", o.threads.torch_inter, "torch inter-op threads")
      ->check(CLI::Range(1, 256))
      ->group("Threads");
  app.add_option("--sched-batch", o.threads.sched_batch,
                 "run every thread under Linux's SCHED_BATCH policy: a woken thread waits for the running one "
                 "instead of preempting it, so a batch's answers are sent together (a third less server CPU per "
                 "gRPC request under load; docs/performance.md). false: the default policy")
      ->group("Threads");
}

// Logs, the access log, and shutdown.
void AddLoggingAndLifecycleOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--log-level", o.logging.level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->group("Logging");
  app.add_option("--log-format", o.logging.format, "text (for people) or json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->group("Logging");
  app.add_flag("--access-log", o.logging.access_log,
               "log one line per Classify/Tag call: request id, peer, model@version, texts, tokens, status, "
               "total/queue/compute ms")
      ->group("Logging");
  app.add_option("--access-log-queue", o.logging.access_log_queue,
                 "access lines queued for stderr; when stderr falls behind, the oldest queued line is dropped "
                 "(counted in qvi_access_log_dropped_lines_total) rather than holding up calls")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20))
      ->group("Logging");
  app.add_option("--trace-rate", o.logging.trace_rate,
                 "share of calls (0 to 1) whose access line also gets where their time went (prepare, queue, "
                 "forward, post-process, serialise ms) and a trace id; calls with a W3C traceparent always do")
      ->check(FiniteRange(0.0, 1.0))
      ->group("Logging");
  app.add_option("--shutdown-grace-seconds", o.shutdown_grace_seconds,
                 "on SIGTERM/SIGINT, time given to accepted requests to finish")
      ->check(FiniteRange(0.0, 3600.0))
      ->group("Lifecycle");
  app.add_option("--shutdown-delay-seconds", o.shutdown_delay_seconds,
                 "on SIGTERM/SIGINT, report NOT_SERVING on health this long while still taking calls, before "
                 "refusing new ones (set it above the readiness probe's period on Kubernetes); a second signal "
                 "ends the delay")
      ->check(FiniteRange(0.0, 3600.0))
      ->group("Lifecycle");
}

}  // namespace

absl::StatusOr<absl::Duration> ParseIdleDuration(const std::string& text) {
  double seconds = 0;
  absl::Duration d;
  if (absl::SimpleAtod(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--unload-idle-after '", text.substr(0, 40), "': not a duration (10m, 90s, or seconds)"));
  }
  if (d < absl::ZeroDuration() || d > absl::Hours(24 * 365)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--unload-idle-after '", text.substr(0, 40), "': from 0 (never) to a year"));
  }
  return d;
}

absl::StatusOr<ServerOptions> ParseServerOptions(int argc, char** argv) {
  ServerOptions o;
  CLI::App app{
      "qvi-server: gRPC inference for attention models with query-value interaction.\n"
      "Serves the model versions under --model-store (<name>/<version>/model.pt or .pt2) through the\n"
      "qvi.serving.v1.Inference service, with grpc.health.v1 health checks and server reflection.\n"
      "Flags may also come from a TOML or INI file given with --config (keys are the long flag names).",
      "qvi-server"};
  app.set_config("--config", "", "read options from this TOML/INI file; flags on the command line win");
  app.set_version_flag("--version", "qvi-server 0.1.0");
  app.option_defaults()->always_capture_default();
  // The per-version defaults that are not flags (server/core/sched/defaults.h); GetModel shows each
  // version's effective values.
  app.footer(absl::StrCat(
      "Each model version is served with these batching defaults unless its manifest's `serving` block or\n"
      "<model-store>/<model>/serving.json sets them (docs/serving.md, \"Batching knobs\"):\n"
      "  max_batch_size=",
      defaults::kMaxBatchSize, " max_batch_tokens=", defaults::kMaxBatchTokens,
      " max_queue_delay_ms=", defaults::kMaxQueueDelayMs, " max_queued_texts=", defaults::kMaxQueuedTexts,
      " max_queued_tokens=", defaults::kMaxQueuedTokens, " batch_when_idle=",
      defaults::kBatchWhenIdle ? "true" : "false", " priority_aging_ms=", defaults::kPriorityAgingMs,
      "\nand on a GPU, unless the manifest's `serving.cuda` block or serving.json sets them:\n  max_batch_size=",
      defaults::kGpuMaxBatchSize, " max_batch_tokens=", defaults::kGpuMaxBatchTokens,
      " max_queued_texts=", defaults::kGpuMaxQueuedTexts, " max_queued_tokens=", defaults::kGpuMaxQueuedTokens));

  for (auto* add : {&AddModelOptions, &AddMemoryOptions, &AddNetworkOptions, &AddHttpOptions, &AddTlsOptions,
                    &AddAuthOptions, &AddLimitOptions, &AddThreadOptions, &AddLoggingAndLifecycleOptions,
                    &AddTracingOptions, &AddDecisionLogOptions}) {
    add(app, o);
  }

  try {
    app.parse(argc, argv);
    if (o.tls.cert.empty() != o.tls.key.empty()) {
      throw CLI::ValidationError("--tls-cert, --tls-key", "give both or neither");
    }
    if (!o.tls.client_ca.empty() && o.tls.cert.empty()) {
      throw CLI::ValidationError("--tls-client-ca", "needs --tls-cert and --tls-key (mutual TLS is TLS first)");
    }
    if (!o.tls.cert.empty()) {
      // A set that cannot serve stops the server here (exit 2), not at the first handshake.
      absl::StatusOr<TlsSet> set = LoadTlsSet({o.tls.cert, o.tls.key, o.tls.client_ca}, absl::Now());
      if (!set.ok()) return absl::InvalidArgumentError(absl::StrCat(set.status().message(), "\n"));
    }
  } catch (const CLI::CallForHelp&) {
    return absl::CancelledError(app.help());
  } catch (const CLI::CallForVersion&) {
    return absl::CancelledError("qvi-server 0.1.0\n");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(std::string(e.what()) + "\nRun with --help for the options.\n");
  }
  return o;
}

}  // namespace qvi
