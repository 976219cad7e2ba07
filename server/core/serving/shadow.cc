#include "server/core/serving/shadow.h"

#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/outputs/outputs.h"

namespace qvi {

std::string TextSha256(const std::string& text) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  std::string hex;
  for (const unsigned char b : digest) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

double ShadowSummary::label_agreement() const {
  return compared == 0 ? 0.0 : static_cast<double>(agreements) / static_cast<double>(compared);
}

std::optional<double> ShadowSummary::span_f1() const {
  if (live_spans + shadow_spans == 0) return std::nullopt;
  return 2.0 * static_cast<double>(same_spans) / static_cast<double>(live_spans + shadow_spans);
}

std::optional<double> ShadowSummary::mean_rank_correlation() const {
  if (rank_correlations == 0) return std::nullopt;
  return rank_correlation_sum / static_cast<double>(rank_correlations);
}

std::optional<double> ShadowSummary::mean_score_difference() const {
  if (score_differences == 0) return std::nullopt;
  return score_difference_sum / static_cast<double>(score_differences);
}

std::optional<double> ShadowSummary::mean_latency_difference_ms() const {
  if (latencies == 0) return std::nullopt;
  return latency_difference_ms_sum / static_cast<double>(latencies);
}

// The two mirrored answers of one sample: whichever comes second compares them.
struct ShadowMirror::Pair {
  Key key;
  std::vector<std::string> texts;
  Mutex mu;
  std::optional<absl::StatusOr<InferenceResponse>> live ABSL_GUARDED_BY(mu), shadow ABSL_GUARDED_BY(mu);
};

ShadowMirror::ShadowMirror(const ModelRepository* repository, ServingObserver* observer, Options options)
    : repository_(repository), observer_(observer), options_(options), rng_(options.seed) {}

std::optional<ShadowSettings> ShadowMirror::Wants(const std::string& model, int64_t version) const {
  if (version != 0) return std::nullopt;
  return repository_->Shadow(model);
}

namespace {

// The outputs both versions are asked for: every label, the words, and the explanation both have
// (contributions, else α).
OutputOptions MirrorOptions(const Manifest& live, const Manifest& shadow) {
  OutputOptions o;
  o.top_k = 1 << 20;
  o.Ask(OutputSwitch::kTokens);
  for (const OutputSwitch on : {OutputSwitch::kContributions, OutputSwitch::kAttention}) {
    if (HasAny(live, SwitchedBy(on)) && HasAny(shadow, SwitchedBy(on))) {
      o.Ask(on);
      break;
    }
  }
  return o;
}

// A mirrored request's failure as a drop's reason: a full request queue (Mirror's own ABORTED) is "busy", a
// batch queue that shed it "shed", anything else "failed".
const char* DropReason(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kAborted:
      return "busy";
    case absl::StatusCode::kResourceExhausted:
      return "shed";
    default:
      return "failed";
  }
}

}  // namespace

const char* ShadowMirror::Sample(const ShadowSettings& settings, const std::vector<std::string>& texts,
                                 const InferenceResponse& live, absl::Time now, Pair& pair) {
  MutexLock lock(&mu_);
  std::bernoulli_distribution take(settings.fraction);
  for (const std::string& text : texts) {
    if (take(rng_)) pair.texts.push_back(text);
  }
  if (pair.texts.empty()) return nullptr;
  auto [it, created] = summaries_.try_emplace(pair.key);
  if (created) {
    it->second.model = live.model;
    it->second.live_version = live.version;
    it->second.shadow_version = settings.version;
    order_[pair.key] = next_order_++;
  }
  it->second.fraction = settings.fraction;
  it->second.keep_texts = settings.keep_texts;
  const auto n = static_cast<int64_t>(pair.texts.size());
  it->second.mirrored += n;
  if (options_.idle && !options_.idle(now)) return "cpu";
  if (inflight_ + n > options_.max_inflight_texts) return "busy";
  inflight_ += n;
  return nullptr;
}

void ShadowMirror::Mirror(Method method, const ShadowSettings& settings, const std::vector<std::string>& texts,
                          const InferenceResponse& live, absl::Time now, const Dispatch& dispatch) {
  if (stopped_.load() || live.version == settings.version || live.manifest == nullptr) return;
  const Key key{live.model, live.version, settings.version};
  auto pair = std::make_shared<Pair>();
  pair->key = key;
  const char* unrun = Sample(settings, texts, live, now, *pair);
  const int64_t n = static_cast<int64_t>(pair->texts.size());
  if (n == 0) return;
  if (unrun != nullptr) return Dropped(key, unrun, n);
  absl::StatusOr<ServableHandle> candidate = repository_->Resolve(live.model, settings.version);
  if (!candidate.ok()) {
    Release(n);
    return Dropped(key, "failed", n);
  }
  const OutputOptions options = MirrorOptions(*live.manifest, (*candidate)->model->manifest());
  auto answer = [this, pair, n](bool is_live, absl::StatusOr<InferenceResponse> out) {
    std::optional<absl::StatusOr<InferenceResponse>> live_out, shadow_out;
    {
      MutexLock lock(&pair->mu);
      (is_live ? pair->live : pair->shadow) = std::move(out);
      if (!pair->live || !pair->shadow) return;
      live_out = std::move(pair->live);
      shadow_out = std::move(pair->shadow);
    }
    Release(n);
    if (!live_out->ok()) return Dropped(pair->key, DropReason(live_out->status()), n);
    if (!shadow_out->ok()) return Dropped(pair->key, DropReason(shadow_out->status()), n);
    Compared(pair->key, pair->texts, **live_out, **shadow_out);
  };
  for (const bool is_live : {true, false}) {
    InferenceRequest r;
    r.model = live.model;
    r.version = is_live ? live.version : settings.version;
    r.texts = pair->texts;
    r.options = options;
    // The caller's id names it, within any id limit (a long one is named by its hash's start).
    r.request_id = absl::StrCat(
        "shadow-", live.request_id.size() <= 64 ? live.request_id : TextSha256(live.request_id).substr(0, 32));
    r.priority = Priority::kLow;
    r.deadline = now + options_.timeout;
    Done done = [answer, is_live](absl::StatusOr<InferenceResponse> out) { answer(is_live, std::move(out)); };
    if (!dispatch(method, std::move(r), done)) {
      done(absl::AbortedError("the server's request queue is full"));
    }
  }
}

namespace {

// One text's comparison into the summary's sums.
void Tally(const TextComparison& c, ShadowSummary& s) {
  ++s.compared;
  s.agreements += c.agrees() ? 1 : 0;
  if (c.live_label != c.shadow_label) ++s.flips[{c.live_label, c.shadow_label}];
  s.live_spans += c.live_spans;
  s.shadow_spans += c.shadow_spans;
  s.same_spans += c.same_spans;
  if (c.rank_correlation) {
    s.rank_correlation_sum += *c.rank_correlation;
    ++s.rank_correlations;
  }
  if (c.score_difference) {
    s.score_difference_sum += *c.score_difference;
    s.abs_score_difference_sum += std::abs(*c.score_difference);
    ++s.score_differences;
  }
}

}  // namespace

bool ShadowMirror::Keep(const TextComparison& c, const std::string& text, ShadowSummary& s) const {
  ShadowSummary::Disagreement d;
  d.severity = (c.agrees() ? 0.0 : 2.0) + std::abs(c.score_difference.value_or(0.0)) +
               (c.rank_correlation ? (1.0 - *c.rank_correlation) / 2.0 : 0.0);
  auto& kept = s.disagreements;
  if (d.severity <= 0 || options_.keep_disagreements <= 0 ||
      (static_cast<int>(kept.size()) >= options_.keep_disagreements && kept.back().severity >= d.severity)) {
    return false;
  }
  d.text_sha256 = TextSha256(text);
  if (s.keep_texts && redactor_ == nullptr) d.text = text;
  d.comparison = c;
  kept.insert(std::upper_bound(kept.begin(), kept.end(), d,
                               [](const auto& a, const auto& b) { return a.severity > b.severity; }),
              std::move(d));
  if (static_cast<int>(kept.size()) > options_.keep_disagreements) kept.pop_back();
  return s.keep_texts && redactor_ != nullptr;
}

void ShadowMirror::Compared(const Key& key, const std::vector<std::string>& texts, const InferenceResponse& live,
                            const InferenceResponse& shadow) {
  std::vector<TextComparison> compared;
  for (size_t i = 0; i < texts.size() && i < live.results.size() && i < shadow.results.size(); ++i) {
    compared.push_back(CompareTexts(live.results[i], shadow.results[i]));
  }
  const absl::Duration latency = shadow.compute_time - live.compute_time;
  std::vector<std::string> to_mask;  // texts kept, to be masked before they are shown
  {
    MutexLock lock(&mu_);
    ShadowSummary& s = summaries_[key];
    s.latency_difference_ms_sum += absl::ToDoubleMilliseconds(latency);
    ++s.latencies;
    for (size_t i = 0; i < compared.size(); ++i) {
      Tally(compared[i], s);
      if (Keep(compared[i], texts[i], s)) to_mask.push_back(texts[i]);
    }
  }
  for (std::string& text : to_mask) {
    redactor_({text}, [this, key, sha256 = TextSha256(text)](absl::StatusOr<std::vector<RedactedText>> masked) {
      Masked(key, sha256, masked);
    });
  }
  if (observer_ == nullptr) return;
  const auto& [model, live_version, shadow_version] = key;
  for (const TextComparison& c : compared) observer_->OnShadowCompared(model, live_version, shadow_version, c);
  observer_->OnShadowLatency(model, live_version, shadow_version, latency);
}

void ShadowMirror::Masked(const Key& key, const std::string& sha256,
                          const absl::StatusOr<std::vector<RedactedText>>& masked) {
  if (!masked.ok() || masked->size() != 1) return;  // not kept: its SHA-256 alone
  MutexLock lock(&mu_);
  for (ShadowSummary::Disagreement& d : summaries_[key].disagreements) {
    if (d.text_sha256 == sha256 && d.text.empty()) d.text = (*masked)[0].text;
  }
}

void ShadowMirror::Dropped(const Key& key, const char* reason, int64_t texts) {
  {
    MutexLock lock(&mu_);
    summaries_[key].dropped[reason] += texts;
  }
  if (observer_ != nullptr) {
    observer_->OnShadowDropped(std::get<0>(key), std::get<1>(key), std::get<2>(key), reason, texts);
  }
}

void ShadowMirror::Release(int64_t texts) {
  MutexLock lock(&mu_);
  inflight_ -= texts;
}

std::vector<ShadowSummary> ShadowMirror::Summaries(const std::string& model) const {
  MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, ShadowSummary>> found;
  for (const auto& [key, summary] : summaries_) {
    if (std::get<0>(key) == model) found.emplace_back(order_.at(key), summary);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ShadowSummary> out;
  for (auto& [_, summary] : found) out.push_back(std::move(summary));
  return out;
}

}  // namespace qvi
