// What the server records of its decisions (docs/observability.md): the decision log (--decision-log; the
// flags, and the log opened before the first call, its lines and drops counted in Prometheus), the shadow
// mirror (docs/serving.md, "Shadow versions") and the drift gauges (--drift-window-texts).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
  app.add_option("--drift-window-texts", d.drift_window_texts,
                 "the drift gauges compare each model version's last N callers' texts with its card's reference "
                 "(qvi_drift_*); 0: no gauges")
      ->check(CLI::Range(0, 1 << 20))
      ->group("Drift");
}

void Server::StartShadowAndDrift() {
  ShadowMirror::Options shadow;
  shadow.max_inflight_texts = options_.limits.shadow_max_inflight_texts;
  shadow_ = std::make_unique<ShadowMirror>(repository_.get(), metrics_.get(), shadow);
  core_->SetShadow(shadow_.get());
  if (options_.decisions.drift_window_texts <= 0) return;
  drift_ = std::make_unique<DriftMonitor>(options_.decisions.drift_window_texts, metrics_.get());
  core_->SetDrift(drift_.get());
}

absl::Status Server::StartDecisionLog() {
  const ServerOptions::Decisions& d = options_.decisions;
  if (d.path.empty()) return absl::OkStatus();
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
  if (metrics_) {
    std::shared_ptr<DecisionLog> held = decisions_;  // a scrape may come while the server is torn down
    metrics_->AddScrapedCounter("qvi_decision_log_lines_total", "Decision-log lines written (--decision-log)",
                                [held] { return static_cast<double>(held->lines()); });
    metrics_->AddScrapedCounter("qvi_decision_log_dropped_lines_total",
                                "Decision-log lines dropped: the writer's queue was full, or the file could not "
                                "be written",
                                [held] { return static_cast<double>(held->dropped()); });
  }
  spdlog::info("decision log: {} of the calls to {}{}", d.rate, d.path, d.texts ? " (with their texts)" : "");
  return absl::OkStatus();
}

}  // namespace qvi
