#include "server/core/serving/response_cache.h"

#include <openssl/sha.h>

#include <array>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace qvi {
namespace {

template <typename T>
int64_t VectorBytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

// A length before each part, so that no two different tuples hash the same bytes.
void AddPart(std::string* buffer, std::string_view part) {
  const uint64_t size = part.size();
  buffer->append(reinterpret_cast<const char*>(&size), sizeof(size));
  buffer->append(part.data(), part.size());
}

}  // namespace

ResponseCache::ResponseCache(int64_t capacity_bytes, Events* events) : capacity_(capacity_bytes), events_(events) {}

std::string ResponseCache::OptionsKey(Method method, const OutputOptions& o) {
  return absl::StrCat(method == Method::kClassify ? "classify" : "tag", "|top_k=", o.top_k,
                      "|outputs=", o.outputs.to_string(), "|error_on_truncation=", o.error_on_truncation,
                      "|layers=", absl::StrJoin(o.layers.layers, ","), "|heads=", absl::StrJoin(o.layers.heads, ","),
                      "|reduction=", static_cast<int>(o.layers.reduction), "|faithfulness=", o.faithfulness_top_k,
                      "|subwords=", o.subwords, "|raw_scores=", o.raw_scores,
                      "|coverage=", o.coverage ? absl::StrFormat("%a", *o.coverage) : "none",
                      "|abstain_below=", o.abstain_below ? absl::StrFormat("%a", *o.abstain_below) : "none",
                      "|tag_probabilities=", o.tag_probabilities);
}

ResponseCache::Key ResponseCache::KeyOf(const std::string& model, uint64_t generation, const std::string& options_key,
                                        std::string_view text) {
  std::string buffer;
  buffer.reserve(model.size() + options_key.size() + text.size() + 32);
  AddPart(&buffer, model);
  buffer.append(reinterpret_cast<const char*>(&generation), sizeof(generation));
  AddPart(&buffer, options_key);
  AddPart(&buffer, text);
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest;
  SHA256(reinterpret_cast<const unsigned char*>(buffer.data()), buffer.size(), digest.data());
  Key key;
  for (int i = 0; i < 8; ++i) {
    key.hi = (key.hi << 8) | digest[static_cast<size_t>(i)];
    key.lo = (key.lo << 8) | digest[static_cast<size_t>(i + 8)];
  }
  return key;
}

int64_t ResponseCache::Bytes(const TextResult& r) {
  int64_t bytes = static_cast<int64_t>(sizeof(Entry)) + VectorBytes(r.labels) + VectorBytes(r.margins) +
                  VectorBytes(r.contribution_rest) + VectorBytes(r.spans) + VectorBytes(r.tokens) +
                  VectorBytes(r.layers) + VectorBytes(r.words);
  for (const WordPieces& w : r.words)
    bytes += static_cast<int64_t>(w.token.text.capacity() + w.token.normalized.capacity());
  for (const auto& [label, _] : r.labels) bytes += static_cast<int64_t>(label.capacity());
  for (const SpanOutput& s : r.spans) {
    bytes += static_cast<int64_t>(s.label.capacity() + s.text.capacity()) + VectorBytes(s.occlusion);
  }
  for (const TokenOutput& t : r.tokens) {
    bytes += static_cast<int64_t>(t.token.text.capacity() + t.token.normalized.capacity() + t.tag.capacity()) +
             VectorBytes(t.contribution) + VectorBytes(t.sentence_contribution) + VectorBytes(t.occlusion) +
             VectorBytes(t.tag_probabilities);
  }
  for (const LayerMapOutput& l : r.layers) {
    bytes += VectorBytes(l.gates) + VectorBytes(l.lambda_q) + VectorBytes(l.lambda_k) + VectorBytes(l.attention);
  }
  if (r.faithfulness)
    bytes += static_cast<int64_t>(r.faithfulness->label.capacity()) + VectorBytes(r.faithfulness->removed);
  return bytes;
}

std::vector<std::optional<TextResult>> ResponseCache::Find(const std::string& model, const std::vector<Key>& keys) {
  std::vector<std::optional<TextResult>> found(keys.size());
  int hits = 0;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = index_.find(keys[i]);
      if (it == index_.end()) continue;
      lru_.splice(lru_.begin(), lru_, it->second);  // most recently used now
      found[i] = it->second->result;
      ++hits;
    }
  }
  if (events_ != nullptr) events_->OnLookups(model, hits, static_cast<int>(keys.size()) - hits);
  return found;
}

void ResponseCache::Insert(const std::string& model, const Key& key, const TextResult& result) {
  const int64_t bytes = Bytes(result);
  if (bytes > capacity_) return;
  std::map<std::string, int> evicted;
  int64_t held = 0;
  {
    MutexLock lock(&mu_);
    if (index_.count(key) > 0) return;  // answered twice at once: the first stays
    while (bytes_ + bytes > capacity_ && !lru_.empty()) {
      const Entry& last = lru_.back();
      ++evicted[last.model];
      bytes_ -= last.bytes;
      index_.erase(last.key);
      lru_.pop_back();
    }
    lru_.push_front(Entry{key, model, result, bytes});
    index_.emplace(key, lru_.begin());
    bytes_ += bytes;
    held = bytes_;
  }
  if (events_ == nullptr) return;
  events_->OnSize(held);
  for (const auto& [m, n] : evicted) events_->OnEvictions(m, n);
}

int64_t ResponseCache::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

size_t ResponseCache::entries() const {
  MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace qvi
