// The server's span export (--otlp-endpoint, docs/observability.md "Traces"): the flags, and the
// exporter and batch-span observer made before the first model loads, so that the first call's spans
// go out too.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/server.h"
#include "server/server_options.h"

namespace qvi {

void AddTracingOptions(CLI::App& app, ServerOptions& o) {
  app.add_option("--otlp-endpoint", o.tracing.otlp_endpoint,
                 "export OpenTelemetry spans of calls and batches to this OTLP/HTTP collector: http://host:port "
                 "(path /v1/traces) or http://host:port/path. Empty: no spans")
      ->group("Tracing");
  app.add_option("--otlp-sampling-ratio", o.tracing.sampling_ratio,
                 "share of calls without a traceparent whose trace is exported (0 to 1); a call with a traceparent "
                 "follows its sampled flag")
      ->check(FiniteRange(0.0, 1.0))
      ->group("Tracing");
  app.add_option("--otlp-service-name", o.tracing.service_name, "the spans' service.name")->group("Tracing");
  app.add_option("--otlp-resource-attributes", o.tracing.resource_attributes,
                 "more resource attributes, key=value,key=value (deployment.environment=prod,k8s.pod.name=...)")
      ->group("Tracing");
  app.add_option("--otlp-queue-spans", o.tracing.queue_spans,
                 "spans waiting for the exporter, at most; beyond it they are dropped (qvi_otlp_spans_total"
                 "{outcome=\"dropped\"}), never a call slowed")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Tracing");
  app.add_option("--otlp-timeout-seconds", o.tracing.timeout_seconds,
                 "connecting to, sending to and hearing from the collector, each; a batch past it is counted failed")
      ->check(FiniteRange(0.01, 300.0))
      ->group("Tracing");
}

absl::Status Server::StartTracing() {
  const ServerOptions::Tracing& t = options_.tracing;
  if (t.otlp_endpoint.empty()) return absl::OkStatus();
  OtlpOptions o;
  o.endpoint = t.otlp_endpoint;
  o.service_name = t.service_name;
  absl::StatusOr<std::map<std::string, std::string>> resource = ParseResourceAttributes(t.resource_attributes);
  if (!resource.ok()) return resource.status();
  o.resource = *std::move(resource);
  o.max_queue = static_cast<size_t>(t.queue_spans);
  o.timeout = absl::Seconds(t.timeout_seconds);
  Metrics* metrics = metrics_.get();
  absl::StatusOr<std::unique_ptr<OtlpExporter>> exporter =
      OtlpExporter::Create(std::move(o), [metrics](const char* outcome, int64_t spans) {
        if (metrics != nullptr) metrics->OnSpans(outcome, spans);
      });
  if (!exporter.ok()) return exporter.status();
  otlp_ = *std::move(exporter);
  tracing_ = std::make_unique<TracingObserver>(metrics_.get(), otlp_.get());
  spdlog::info("exporting spans to {} (OTLP/HTTP), {} of the calls without a traceparent", t.otlp_endpoint,
               t.sampling_ratio);
  return absl::OkStatus();
}

}  // namespace qvi
