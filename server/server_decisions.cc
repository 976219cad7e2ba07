// What the server records of its decisions (docs/observability.md): the decision log (--decision-log; the
// flags, and the log opened before the first call, its lines and drops counted in Prometheus), the shadow
// mirror (docs/serving.md, "Shadow versions") and the drift gauges (--drift-window-texts).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/serving/cpu_budget.h"
#include "server/core/serving/redaction.h"
#include "server/server.h"
#include "server/server_options.h"

namespace qvi {
namespace {

// "name=rate" pairs (--decision-log-model-rate, --decision-log-key-rate); the error names the flag.
absl::StatusOr<std::map<std::string, double>> ParseRates(const std::vector<std::string>& pairs, const char* flag) {
  std::map<std::string, double> out;
  for (const std::string& pair : pairs) {
    std::vector<std::string> parts = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    double rate = 0;
    if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtod(parts[1], &rate) || !(rate >= 0 && rate <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", pair, "' is not NAME=RATE with RATE in [0, 1]"));
    }
    out[parts[0]] = rate;
  }
  return out;
}

}  // namespace

void AddDecisionLogOptions(CLI::App& app, ServerOptions& o) {
  ServerOptions::Decisions& d = o.decisions;
  app.add_option("--decision-log", d.path,
                 "write a sampled JSON line of each call's decision here (labels or spans, scores, top words, "
                 "the model's digest); rotated. Empty: none")
      ->group("Decision log");
  app.add_option("--decision-log-rate", d.rate, "share of calls logged (0 to 1)")
      ->check(FiniteRange(0.0, 1.0))
      ->group("Decision log");
  app.add_option("--decision-log-model-rate", d.model_rates, "a model's own share, MODEL=RATE (repeatable)")
      ->group("Decision log");
  app.add_option("--decision-log-key-rate", d.key_rates, "an API key's own share, KEY=RATE (repeatable; wins)")
      ->group("Decision log");
  app.add_option("--decision-log-max-bytes", d.max_bytes, "a file's size before it is rotated")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40))
      ->group("Decision log");
  app.add_option("--decision-log-keep", d.keep, "rotated files kept (PATH.1 the newest)")
      ->check(CLI::Range(0, 1000))
      ->group("Decision log");
  app.add_flag("--decision-log-texts", d.texts, "also write the texts themselves (else only their SHA-256)")
      ->group("Decision log");
  app.add_option("--decision-log-queue", d.queue_lines, "lines waiting for the writer; beyond it dropped, counted")
      ->check(CLI::Range(1, 1 << 24))
      ->group("Decision log");
  app.add_option("--decision-log-otlp-endpoint", d.otlp_endpoint,
                 "also send each line as an OTLP log record to this collector, http://host:port[/path] (path "
                 "/v1/logs by default); with it --decision-log may be left out")
      ->group("Decision log");
  app.add_option("--redact-texts-with", d.redact_with,
                 "mask the entities this tagger of the store finds (\"[PER] flew to [LOC]\") in every text the "
                 "server keeps: the decision log's (--decision-log-texts) and a shadow summary's (keep_texts); a "
                 "text it cannot read whole is not kept")
      ->group("Decision log");
  app.add_option("--redact-types", d.redact_types, "the entity types masked (comma-separated)")
      ->delimiter(',')
      ->group("Decision log");
  app.add_option("--drift-window-texts", d.drift_window_texts,
                 "the drift gauges compare each model version's last N callers' texts with its card's reference "
                 "(qvi_drift_*); 0: no gauges")
      ->check(CLI::Range(0, 1 << 20))
      ->group("Drift");
  app.add_option("--shadow-max-cpu-busy", o.limits.shadow_max_cpu_busy,
                 "mirror texts to shadow candidates only while the process's CPU time since its previous measure "
                 "(at least 100 ms before) is below this share of its usable CPUs; others are dropped and counted "
                 "(cpu). 1: whenever")
      ->check(FiniteRange(0.0, 1.0))
      ->group("Limits");
}

void Server::StartRecorders() {
  ShadowMirror::Options shadow;
  shadow.max_inflight_texts = options_.limits.shadow_max_inflight_texts;
  if (options_.limits.shadow_max_cpu_busy < 1) {
    headroom_ = std::make_unique<CpuHeadroom>(
        CpuHeadroom::Options{.max_busy = options_.limits.shadow_max_cpu_busy, .cpus = UsableCpus().cpus});
    shadow.idle = [headroom = headroom_.get()](absl::Time now) { return headroom->Idle(now); };
  }
  shadow_ = std::make_unique<ShadowMirror>(repository_.get(), metrics_.get(), shadow);
  core_->SetShadow(shadow_.get());
  if (options_.decisions.drift_window_texts > 0) {
    drift_ = std::make_unique<DriftMonitor>(options_.decisions.drift_window_texts, metrics_.get());
    core_->SetDrift(drift_.get());
  }
  const ServerOptions::Decisions& d = options_.decisions;
  if (d.redact_with.empty()) return;
  TextRedactor redactor = TaggerRedactor(core_.get(), d.redact_with, {d.redact_types.begin(), d.redact_types.end()});
  shadow_->SetRedactor(redactor);
  if (decisions_) decisions_->SetRedactor(d.redact_with, redactor);
  spdlog::info("texts the server keeps are masked with {} ({})", d.redact_with, absl::StrJoin(d.redact_types, ","));
}

absl::Status Server::StartDecisionLog() {
  const ServerOptions::Decisions& d = options_.decisions;
  if (d.path.empty() && d.otlp_endpoint.empty()) return absl::OkStatus();
  DecisionLog::Options o;
  o.path = d.path;
  o.rate = d.rate;
  absl::StatusOr<std::map<std::string, double>> models = ParseRates(d.model_rates, "--decision-log-model-rate");
  if (!models.ok()) return models.status();
  absl::StatusOr<std::map<std::string, double>> keys = ParseRates(d.key_rates, "--decision-log-key-rate");
  if (!keys.ok()) return keys.status();
  o.model_rates = *std::move(models);
  o.key_rates = *std::move(keys);
  o.max_bytes = d.max_bytes;
  o.keep = d.keep;
  o.texts = d.texts;
  o.queue_lines = d.queue_lines;
  absl::StatusOr<std::shared_ptr<DecisionLog>> log = DecisionLog::Open(std::move(o));
  if (!log.ok()) return log.status();
  decisions_ = *std::move(log);
  if (absl::Status s = StartDecisionLogExport(); !s.ok()) return s;
  if (metrics_) {
    std::shared_ptr<DecisionLog> held = decisions_;  // a scrape may come while the server is torn down
    metrics_->AddScrapedCounter("qvi_decision_log_lines_total", "Decision-log lines written (--decision-log)",
                                [held] { return static_cast<double>(held->lines()); });
    metrics_->AddScrapedCounter("qvi_decision_log_dropped_lines_total",
                                "Decision-log lines dropped: the writer's queue was full, or the file could not "
                                "be written",
                                [held] { return static_cast<double>(held->dropped()); });
    metrics_->AddScrapedCounter("qvi_decision_log_redaction_failures_total",
                                "Decision-log lines written with their texts null: the redaction failed "
                                "(--redact-texts-with)",
                                [held] { return static_cast<double>(held->redaction_failures()); });
  }
  spdlog::info("decision log: {} of the calls to {}{}{}", d.rate, d.path.empty() ? d.otlp_endpoint : d.path,
               d.texts ? " (with their texts)" : "", d.redact_with.empty() ? "" : ", masked with " + d.redact_with);
  return absl::OkStatus();
}

// --decision-log-otlp-endpoint: each line as an OTLP log record, the call's trace id on it, beside the traces.
absl::Status Server::StartDecisionLogExport() {
  const ServerOptions::Decisions& d = options_.decisions;
  if (d.otlp_endpoint.empty()) return absl::OkStatus();
  OtlpOptions o;
  o.endpoint = d.otlp_endpoint;
  o.service_name = options_.tracing.service_name;
  absl::StatusOr<std::map<std::string, std::string>> resource =
      ParseResourceAttributes(options_.tracing.resource_attributes);
  if (!resource.ok()) return resource.status();
  o.resource = *std::move(resource);
  o.max_queue = static_cast<size_t>(d.queue_lines);
  o.timeout = absl::Seconds(options_.tracing.timeout_seconds);
  auto counts = std::make_shared<std::array<std::atomic<int64_t>, 3>>();  // exported, dropped, failed
  absl::StatusOr<std::unique_ptr<OtlpLogExporter>> exporter = OtlpLogExporter::Create(
      std::move(o), "--decision-log-otlp-endpoint", [counts](const char* outcome, int64_t records) {
        const std::string_view what = outcome;
        (*counts)[what == "exported" ? 0 : what == "dropped" ? 1 : 2].fetch_add(records);
      });
  if (!exporter.ok()) return exporter.status();
  decision_otlp_ = *std::move(exporter);
  decisions_->SetSink([exporter = decision_otlp_](const DecisionLog::Written& w) {
    LogRecord r;
    r.time = w.time;
    r.event_name = "qvi.decision";
    r.body = w.line;
    r.trace_id = TraceIdFromHex(w.trace_id);
    r.attributes = {{"qvi.model", w.model}, {"qvi.version", w.version}, {"qvi.request_id", w.request_id}};
    exporter->Export(std::move(r));
  });
  if (metrics_) {
    int i = 0;
    for (const char* outcome : {"exported", "dropped", "failed"}) {
      metrics_->AddScrapedCounter(absl::StrCat("qvi_decision_log_otlp_", outcome, "_total"),
                                  absl::StrCat("Decision-log lines sent as OTLP log records: ", outcome),
                                  [counts, i] { return static_cast<double>((*counts)[i].load()); });
      ++i;
    }
  }
  return absl::OkStatus();
}

}  // namespace qvi
