#include "server/core/serving/drift.h"

#include <algorithm>
#include <cmath>

namespace qvi {

double PopulationStability(const std::vector<int64_t>& counts, int64_t total, const std::vector<double>& reference) {
  constexpr double kFloor = 1e-4;  // a bin empty on one side would make the sum infinite
  double psi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double live = std::max(kFloor, static_cast<double>(counts[i]) / static_cast<double>(total));
    const double ref = std::max(kFloor, i < reference.size() ? reference[i] : 0.0);
    psi += (live - ref) * std::log(live / ref);
  }
  return psi;
}

// One version's last texts and their sums, each text kept as its bins.
struct DriftMonitor::Window {
  explicit Window(std::shared_ptr<const Manifest> m) : manifest(std::move(m)), ref(*manifest->drift_reference) {
    for (const auto& [label, share] : ref.labels) {
      index.emplace(label, labels.size());
      labels.push_back(share);
    }
    label_counts.assign(labels.size() + 1, 0);  // the last: labels the reference never saw
    length_counts.assign(ref.length.shares.size(), 0);
    confidence_counts.assign(ref.confidence.shares.size(), 0);
  }

  struct Kept {
    uint32_t units = 0, unknown = 0;
    size_t length_bin = 0;
    struct Answer {
      size_t label = 0;     // its label's bin
      int confidence = -1;  // its confidence's bin; -1: not scored at the reference's temperature
      bool below = false;   // scored below the reference's threshold
    };
    std::vector<Answer> answers;
  };

  Kept Keep(const Text& t) const {
    Kept k{t.units, t.unknown, ref.length.Bin(t.tokens), {}};
    k.answers.reserve(t.answers.size());
    for (const auto& [label, score] : t.answers) {
      auto it = index.find(label);
      Kept::Answer& a = k.answers.emplace_back();
      a.label = it == index.end() ? labels.size() : it->second;
      if (!score) continue;
      a.confidence = static_cast<int>(ref.confidence.Bin(*score));
      a.below = *score < ref.below_threshold;
    }
    return k;
  }

  void Add(const Kept& k, int64_t sign) {
    units += sign * k.units;
    unknown += sign * k.unknown;
    length_counts[k.length_bin] += sign;
    for (const Kept::Answer& a : k.answers) {
      label_counts[a.label] += sign;
      answers += sign;
      if (a.confidence < 0) continue;
      confidence_counts[a.confidence] += sign;
      scored += sign;
      below += a.below ? sign : 0;
    }
  }

  DriftReading Read() const {
    DriftReading r;
    r.texts = static_cast<int64_t>(texts.size());
    r.answers = scored;
    if (answers > 0) r.label_psi = PopulationStability(label_counts, answers, labels);
    if (!texts.empty()) r.length_psi = PopulationStability(length_counts, r.texts, ref.length.shares);
    if (scored > 0) {
      r.confidence_psi = PopulationStability(confidence_counts, scored, ref.confidence.shares);
      r.below = static_cast<double>(below) / static_cast<double>(scored);
    }
    if (units > 0) r.unknown = static_cast<double>(unknown) / static_cast<double>(units);
    r.unknown_reference = ref.unknown;
    r.below_reference = ref.below_share;
    r.below_threshold = ref.below_threshold;
    return r;
  }

  const std::shared_ptr<const Manifest> manifest;  // holds `ref`
  const DriftReference& ref;
  std::map<std::string, size_t> index;  // label -> its bin
  std::vector<double> labels;           // the reference's share of each bin
  std::deque<Kept> texts;
  std::vector<int64_t> label_counts, length_counts, confidence_counts;
  int64_t units = 0, unknown = 0, answers = 0, scored = 0, below = 0;
};

DriftMonitor::DriftMonitor(int window_texts, ServingObserver* observer)
    : window_(static_cast<size_t>(std::max(1, window_texts))), observer_(observer) {}
DriftMonitor::~DriftMonitor() = default;

std::vector<DriftMonitor::Text> DriftMonitor::Read(const InferenceResponse& answer, bool raw_scores) {
  std::vector<Text> texts;
  if (answer.manifest == nullptr || !answer.manifest->drift_reference) return texts;
  const Manifest& m = *answer.manifest;
  const double t = m.drift_reference->temperature;
  const bool scored = std::abs(m.ScoreTemperature(raw_scores) - t) <= 1e-6 * t;
  texts.reserve(answer.results.size());
  for (const TextResult& r : answer.results) {
    Text& text = texts.emplace_back();
    text.tokens = std::min<uint32_t>(r.num_tokens, static_cast<uint32_t>(std::max(0, m.tokenizer.max_tokens)));
    text.units = r.vocab_units;
    text.unknown = r.vocab_unknown;
    if (m.task == Task::kClassification && !r.labels.empty()) {
      text.answers.emplace_back(r.labels.front().first,
                                scored ? std::optional<float>(r.labels.front().second) : std::nullopt);
    }
    for (const SpanOutput& span : r.spans) {
      text.answers.emplace_back(span.label, scored ? std::optional<float>(span.score) : std::nullopt);
    }
  }
  return texts;
}

void DriftMonitor::Observe(const std::string& model, int64_t version, const std::shared_ptr<const Manifest>& manifest,
                           const std::vector<Text>& texts) {
  if (texts.empty()) return;
  DriftReading reading;
  {
    MutexLock lock(&mu_);
    std::unique_ptr<Window>& w = windows_[{model, version}];
    if (w == nullptr || w->manifest != manifest) w = std::make_unique<Window>(manifest);
    for (const Text& t : texts) {
      w->texts.push_back(w->Keep(t));
      w->Add(w->texts.back(), 1);
      if (w->texts.size() > window_) {
        w->Add(w->texts.front(), -1);
        w->texts.pop_front();
      }
    }
    reading = w->Read();
  }
  // Told outside the lock, which every answer thread takes (two answers told out of order: the older reading
  // may show until the next answer).
  if (observer_ != nullptr) observer_->OnDrift(model, version, reading);
}

std::optional<DriftReading> DriftMonitor::Reading(const std::string& model, int64_t version) const {
  MutexLock lock(&mu_);
  auto it = windows_.find({model, version});
  if (it == windows_.end()) return std::nullopt;
  return it->second->Read();
}

}  // namespace qvi
