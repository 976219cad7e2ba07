// The response cache (--response-cache-bytes): one text's answer kept, so that the same text asked
// again with the same options is answered without the model.
//
// Key: the model, the generation of the servable that answered (a version loaded again from changed
// files is another generation, so a version switch or reload never serves the old answers), what of
// the request changes the answer (the method and the options: OptionsKey), and the text. They are
// hashed with SHA-256, kept to 128 bits: a hash a client cannot steer into another's key, which
// matters on a server several applications share.
// Values: the text's TextResult, everything the answer holds for it (labels or spans, tokens and
// every explanation asked for). The cache is bounded by bytes (an estimate of each result's
// memory), least recently used out first. Thread-safe.
#ifndef QVI_SERVER_CORE_SERVING_RESPONSE_CACHE_H_
#define QVI_SERVER_CORE_SERVING_RESPONSE_CACHE_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "server/core/base/sync.h"
#include "server/core/outputs/answer.h"
#include "server/core/request/request.h"

namespace qvi {

class ResponseCache {
 public:
  struct Key {
    uint64_t hi = 0, lo = 0;
    bool operator==(const Key& o) const { return hi == o.hi && lo == o.lo; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.hi, k.lo);
    }
  };
  // What the cache did, for the metrics: called outside its lock.
  struct Events {
    virtual ~Events() = default;
    virtual void OnLookups(const std::string& model, int hits, int misses) = 0;
    virtual void OnEvictions(const std::string& model, int evicted) = 0;
    // After each answer kept: the bytes the cache holds now.
    virtual void OnSize(int64_t bytes) = 0;
  };

  // `capacity_bytes` > 0. `events` may be null.
  explicit ResponseCache(int64_t capacity_bytes, Events* events = nullptr);

  // What of a request changes its texts' answers: the method and every option but the deadline,
  // the request id and the priority.
  static std::string OptionsKey(Method method, const OutputOptions& options);
  static Key KeyOf(const std::string& model, uint64_t generation, const std::string& options_key,
                   std::string_view text);
  // The memory a result takes, roughly: its strings and arrays (what the byte bound counts).
  static int64_t Bytes(const TextResult& result);

  // One lookup per key, in order: the results found (a copy), counted as hits and misses of `model`.
  std::vector<std::optional<TextResult>> Find(const std::string& model, const std::vector<Key>& keys)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `result` under `key`, evicting the least recently used until it fits; a result larger
  // than the whole cache is not kept.
  void Insert(const std::string& model, const Key& key, const TextResult& result) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t capacity() const { return capacity_; }
  size_t entries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    Key key;
    std::string model;
    TextResult result;
    int64_t bytes = 0;
  };
  const int64_t capacity_;
  Events* const events_;
  mutable Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<Key, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_RESPONSE_CACHE_H_
