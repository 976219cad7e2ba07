#include "server/frontend/decision_log.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace qvi {
namespace {

using json = nlohmann::ordered_json;

double Shortest(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return std::strtod(buf, nullptr);
}

// The words of `r` that contributed most to its top label, else those with the most α; [] when it has neither.
// `ranges` (may be null) gets each one's bytes in the text.
json TopWords(const TextResult& r, int k, std::vector<std::pair<uint32_t, uint32_t>>* ranges) {
  std::vector<std::pair<float, const TokenOutput*>> scored;
  const bool by_contribution = !r.tokens.empty() && !r.tokens[0].contribution.empty();
  for (const TokenOutput& t : r.tokens) {  // a value that is not finite ranks nowhere
    if (by_contribution && !t.contribution.empty() && std::isfinite(t.contribution[0])) {
      scored.emplace_back(t.contribution[0], &t);
    }
    if (!by_contribution && t.attention && std::isfinite(*t.attention)) scored.emplace_back(*t.attention, &t);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  json out = json::array();
  for (size_t i = 0; i < scored.size() && static_cast<int>(i) < k; ++i) {
    const TextToken& word = scored[i].second->token;
    out.push_back({{"word", word.text}, {by_contribution ? "contribution" : "alpha", Shortest(scored[i].first)}});
    if (ranges != nullptr) ranges->emplace_back(word.byte_start, word.byte_end);
  }
  return out;
}

// With `with_text`, the text (null until it is known: a redaction to come).
json TextEntry(const TextResult& r, const std::string& sha256, bool with_text, const std::string* text, int top_words,
               std::vector<std::pair<uint32_t, uint32_t>>* ranges) {
  json t = {{"sha256", sha256}};
  if (with_text) t["text"] = text != nullptr ? json(*text) : json(nullptr);
  if (!r.labels.empty()) {
    json labels = json::array();
    for (const auto& [label, score] : r.labels) labels.push_back({{"label", label}, {"score", Shortest(score)}});
    t["labels"] = std::move(labels);
  } else {
    json spans = json::array();
    for (const SpanOutput& s : r.spans) {
      spans.push_back({{"type", s.label},
                       {"start", s.start},
                       {"end", s.end},
                       {"score", Shortest(s.score)},
                       {"abstained", s.abstained}});
    }
    t["spans"] = std::move(spans);
  }
  t["abstained"] = r.abstained;
  t["top_words"] = TopWords(r, top_words, ranges);
  return t;
}

// The file's SHA-256 in hex; "" when it cannot be read.
std::string FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return "";
  std::array<char, 1 << 16> buf;
  while (in) {
    in.read(buf.data(), buf.size());
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return "";
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest.data(), &n) != 1) return "";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

}  // namespace

absl::StatusOr<std::shared_ptr<DecisionLog>> DecisionLog::Open(Options options) {
  std::shared_ptr<DecisionLog> log(new DecisionLog(std::move(options)));
  if (!log->options_.path.empty()) {
    log->out_.open(log->options_.path, std::ios::app | std::ios::binary);
    if (!log->out_) {
      return absl::InvalidArgumentError(absl::StrCat("--decision-log: cannot open ", log->options_.path));
    }
    std::error_code ec;
    const auto size = std::filesystem::file_size(log->options_.path, ec);
    log->bytes_ = ec ? 0 : static_cast<int64_t>(size);
  }
  log->writer_ = std::thread([raw = log.get()] { raw->Run(); });
  return log;
}

DecisionLog::DecisionLog(Options options) : options_(std::move(options)), rng_(options_.seed) {}

DecisionLog::~DecisionLog() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (writer_.joinable()) writer_.join();
}

bool DecisionLog::Sample(const std::string& model, const std::string& key) {
  double rate = options_.rate;
  if (auto m = options_.model_rates.find(model); m != options_.model_rates.end()) rate = m->second;
  if (auto k = options_.key_rates.find(key); !key.empty() && k != options_.key_rates.end()) rate = k->second;
  if (rate >= 1) return true;
  if (rate <= 0) return false;
  MutexLock lock(&sample_mu_);
  return std::bernoulli_distribution(rate)(rng_);
}

void DecisionLog::Offer(const Call& call) {
  const InferenceResponse& a = *call.answer;
  json line = {{"time", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", call.time, absl::UTCTimeZone())},
               {"model", a.model},
               {"version", a.version},
               {"artifact_sha256", ""},
               {"key", call.key},
               {"request_id", call.request_id},
               {"trace_id", call.trace_id},
               {"latency_ms", absl::ToDoubleMilliseconds(call.latency)}};
  // Redacted: the texts, when they are written, and the top words, which are the texts' own words.
  bool redact = redactor_ != nullptr && !call.texts.empty();
  json texts = json::array();
  TopWordRanges ranges(a.results.size());
  for (size_t i = 0; i < a.results.size() && i < call.text_sha256.size(); ++i) {
    const std::string* text = !redact && i < call.texts.size() ? &call.texts[i] : nullptr;
    texts.push_back(TextEntry(a.results[i], call.text_sha256[i], options_.texts, text, options_.top_words, &ranges[i]));
  }
  redact =
      redact && (options_.texts || std::any_of(ranges.begin(), ranges.end(), [](const auto& r) { return !r.empty(); }));
  line["texts"] = std::move(texts);
  Queued queued;
  queued.time = call.time;
  queued.trace_id = call.trace_id;
  queued.model = a.model;
  queued.version = a.version;
  queued.request_id = call.request_id;
  // The artifact as it is now: the version may be gone (unloaded, replaced) by the time the writer gets here.
  if (const ModelRepository* repository = repository_.load(); repository != nullptr) {
    absl::StatusOr<ServableHandle> servable = repository->Resolve(a.model, a.version);
    if (servable.ok()) {
      queued.artifact = (*servable)->model->file();
      std::error_code ec;
      const auto stamp = std::filesystem::last_write_time(queued.artifact, ec);
      queued.stamp = ec ? "" : absl::StrCat(stamp.time_since_epoch().count());
    }
  }
  if (!redact) {
    queued.line = line.dump(-1, ' ', false, json::error_handler_t::replace);
    return Enqueue(std::move(queued));
  }
  // At most a queue's worth of lines waiting for their redaction, as for the writer.
  if (redacting_.fetch_add(1) >= options_.queue_lines) {
    redacting_.fetch_sub(1);
    dropped_.fetch_add(1);
    return;
  }
  auto redacted = [self = shared_from_this(), line = std::move(line), queued = std::move(queued),
                   ranges = std::move(ranges)](absl::StatusOr<std::vector<RedactedText>> masked) mutable {
    try {
      self->Redacted(std::move(line), std::move(queued), ranges, masked);
    } catch (...) {  // (std::bad_alloc) the line is lost, and counted
      self->dropped_.fetch_add(1);
    }
    self->RedactionDone();
  };
  try {
    redactor_(call.texts, std::move(redacted));
  } catch (...) {  // (std::bad_alloc) before the redaction was queued: the line is lost, and counted
    dropped_.fetch_add(1);
    RedactionDone();
  }
}

void DecisionLog::RedactionDone() {
  MutexLock lock(&mu_);
  redacting_.fetch_sub(1);
  changed_.SignalAll();
}

void DecisionLog::Redacted(json line, Queued queued, const TopWordRanges& ranges,
                           const absl::StatusOr<std::vector<RedactedText>>& masked) {
  json& texts = line["texts"];
  if (masked.ok() && masked->size() == texts.size()) {
    for (size_t i = 0; i < texts.size(); ++i) {
      if (options_.texts) texts[i]["text"] = (*masked)[i].text;
      // A top word inside a masked entity is masked as the entity is.
      for (size_t w = 0; w < ranges[i].size() && w < texts[i]["top_words"].size(); ++w) {
        for (const RedactedText::Masked& m : (*masked)[i].masked) {
          if (ranges[i][w].first < m.byte_end && m.byte_start < ranges[i][w].second) {
            texts[i]["top_words"][w]["word"] = absl::StrCat("[", m.type, "]");
          }
        }
      }
    }
    line["redacted_with"] = redact_with_;
  } else {  // the texts stay null and the top words go: never written unmasked
    redaction_failures_.fetch_add(1);
    for (json& t : texts) t["top_words"] = json::array();
    line["redaction_error"] = masked.ok() ? std::string("the redaction answered another number of texts")
                                          : std::string(masked.status().message());
  }
  queued.line = line.dump(-1, ' ', false, json::error_handler_t::replace);
  Enqueue(std::move(queued));
}

void DecisionLog::Enqueue(Queued queued) {
  MutexLock lock(&mu_);
  if (static_cast<int>(queue_.size()) >= options_.queue_lines || stopping_) {
    dropped_.fetch_add(1);
    return;
  }
  queue_.push_back(std::move(queued));
  ++queued_;
  changed_.SignalAll();
}

void DecisionLog::Flush() {
  MutexLock lock(&mu_);
  while (redacting_.load() > 0) changed_.Wait(&mu_);  // their lines are queued when their redaction ends
  const int64_t target = queued_;
  while (written_ < target) changed_.Wait(&mu_);
}

void DecisionLog::Run() {
  while (true) {
    Queued next;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) changed_.Wait(&mu_);
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      Write(std::move(next));
    } catch (...) {  // (std::bad_alloc) the line is lost, and counted; the writer goes on
      dropped_.fetch_add(1);
    }
    MutexLock lock(&mu_);
    ++written_;
    changed_.SignalAll();
  }
}

std::string DecisionLog::ArtifactSha256(const std::string& path, const std::string& stamp) {
  if (path.empty()) return "";
  const std::string key = absl::StrCat(path, "@", stamp);
  if (auto it = digests_.find(key); it != digests_.end()) return it->second;
  std::string digest = FileSha256(path);
  if (!digest.empty()) digests_.emplace(key, digest);  // a file that could not be read is tried again
  return digest;
}

void DecisionLog::Write(Queued queued) {
  std::string& line = queued.line;
  // The digest goes into the empty string the line was made with ("artifact_sha256":""): the first match, as
  // only time, model and version come before it and a JSON string holds no bare quote.
  const std::string hole = "\"artifact_sha256\":\"\"";
  if (const size_t at = line.find(hole); at != std::string::npos) {
    line.replace(at, hole.size(),
                 absl::StrCat("\"artifact_sha256\":\"", ArtifactSha256(queued.artifact, queued.stamp), "\""));
  }
  if (!options_.path.empty() && !WriteFile(line)) {
    dropped_.fetch_add(1);  // not written (a full disk): counted, and the stream tried again next time
  } else {
    lines_.fetch_add(1);
  }
  if (sink_) sink_(Written{line, queued.time, queued.trace_id, queued.model, queued.version, queued.request_id});
}

bool DecisionLog::WriteFile(const std::string& line) {
  const int64_t size = static_cast<int64_t>(line.size()) + 1;
  if (bytes_ > 0 && bytes_ + size > options_.max_bytes) Rotate();
  if (!out_.is_open() || !out_) {  // a disk that failed before: try the file again
    out_.clear();
    out_.close();
    out_.open(options_.path, std::ios::app | std::ios::binary);
  }
  out_.write(line.data(), static_cast<std::streamsize>(line.size()));
  out_.put('\n');
  out_.flush();
  if (!out_) return false;
  bytes_ += size;
  return true;
}

void DecisionLog::Rotate() {
  out_.close();
  std::error_code ec;
  const std::string& p = options_.path;
  bool rotated = true;
  if (options_.keep > 0) {
    std::filesystem::remove(absl::StrCat(p, ".", options_.keep), ec);
    for (int i = options_.keep - 1; i >= 1; --i) {
      std::filesystem::rename(absl::StrCat(p, ".", i), absl::StrCat(p, ".", i + 1), ec);
    }
    std::filesystem::rename(p, absl::StrCat(p, ".1"), ec);
    rotated = !ec;
  }
  // A file that could not be moved aside is appended to, not emptied: its lines are kept, and the rotation is
  // tried again at the next line.
  out_.open(p, (rotated ? std::ios::trunc : std::ios::app) | std::ios::binary);
  if (rotated) bytes_ = 0;
}

}  // namespace qvi
