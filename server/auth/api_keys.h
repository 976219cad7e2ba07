// API keys with scopes (--api-keys FILE; docs/security.md, "API keys"). The file names each key,
// holds its SHA-256 (never the key itself) and its scopes:
//
//   {"keys": [{"name": "search-app", "sha256": "<64 hex digits>", "scopes": ["infer", "read"],
//              "limits": {"requests_per_second": 50, "texts_per_second": 2000}},
//             {"name": "nightly-batch", "sha256": "...", "scopes": ["infer"], "priority": "low",
//              "max_priority": "normal"},
//             {"name": "platform", "sha256": "...", "scopes": ["infer", "read", "admin"]}],
//    "default_limits": {"requests_per_second": 20}}
//
// "limits" are the key's own buckets (rate_limit.h); "default_limits" one set of buckets shared by the
// keys without their own. "priority" is the batch-queue priority (priority.h) of the key's requests
// that name none (default normal, or max_priority when that is lower); "max_priority" the highest one
// they may name (default high): a request that names a higher one is PERMISSION_DENIED.
//
// A caller sends its key as `authorization: Bearer KEY` (gRPC metadata or the HTTP header). The key's
// SHA-256 is looked up among the set's hashes by its first 8 bytes and the candidate compared whole in
// constant time: what the look-up's timing could tell is about hashes, which lead back to no key, and
// the cost stays the same for 1 key or 1,000. A call without a valid key is
// UNAUTHENTICATED (401), one whose key lacks the call's scope PERMISSION_DENIED (403); neither message
// repeats the key. The server's probes (health, /metrics) need no key.
//
// The file is checked whole before use: at start-up a bad file stops the server with the reason, and
// a reload (the file changed, or SIGHUP) that fails keeps the set in use and says why.
#ifndef QVI_SERVER_AUTH_API_KEYS_H_
#define QVI_SERVER_AUTH_API_KEYS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/auth/rate_limit.h"
#include "server/core/base/sync.h"
#include "server/core/sched/priority.h"

namespace qvi {

// What a call needs its key to allow. `read`: the models' list, their cards and metadata; `infer`:
// Classify, Tag, ModelInfer; `admin`: the model-control calls.
enum class Scope : uint8_t { kInfer = 1, kRead = 2, kAdmin = 4 };

// "infer", "read", "admin".
absl::string_view ScopeName(Scope scope);

struct ApiKey {
  std::string name;  // [A-Za-z0-9._-]{1,64}: the access log's and the metrics' name of the key
  std::array<unsigned char, 32> sha256{};
  uint8_t scopes = 0;  // Scope bits
  // The key's own limits, or (own_limits false) the file's default_limits, shared with the other keys
  // without their own.
  RateLimits limits;
  bool own_limits = false;
  Priority priority = Priority::kNormal;    // of its requests that name none
  Priority max_priority = Priority::kHigh;  // the highest its requests may name
  RateLimiter::Who bucket() const { return {own_limits ? name : std::string(), name, limits}; }
  bool allows(Scope scope) const { return (scopes & static_cast<uint8_t>(scope)) != 0; }
  // "infer, read": the scopes it has, for messages.
  std::string ScopeList() const;
};

struct ApiKeySet {
  static constexpr size_t kMaxKeys = 1000;  // the key name is a metric label: a bounded set
  std::vector<ApiKey> keys;
  std::unordered_multimap<uint64_t, size_t> by_prefix;  // the first 8 bytes of a key's SHA-256 -> its index
};

// Parses and checks a key file's text; the error names the key (by index and name) and the field.
// `source` (the file's path) starts every error message. An empty "keys" refuses every caller, so it is
// taken for the mistake it usually is (INVALID_ARGUMENT) unless `allow_empty` (--api-keys-allow-empty).
absl::StatusOr<ApiKeySet> ParseApiKeys(absl::string_view text, absl::string_view source, bool allow_empty = false);

// The priority a request of `key` is queued at: `asked` (the request's own), else the key's default.
// PERMISSION_DENIED, naming the key and both priorities, when `asked` is above the key's max_priority.
absl::StatusOr<Priority> KeyPriority(const ApiKey& key, Priority asked);

// Reads and parses the file at `path`.
absl::StatusOr<ApiKeySet> LoadApiKeys(const std::string& path, bool allow_empty = false);

// The key of `set` whose SHA-256 is `presented`'s, or null.
const ApiKey* MatchKey(const ApiKeySet& set, absl::string_view presented);

// What a transport passes as the `authorization` value of a call that carries the header more than
// once (a proxy that added its own beside the client's): whichever came first must not decide, so
// BearerToken refuses it. No header's value can hold a NUL, so none is mistaken for it.
inline constexpr absl::string_view kRepeatedAuthorization("\0repeated", 9);
// What a transport passes as the `authorization` value of a call whose metadata is over the server's
// per-call limit: Calls::Authorize refuses it (RESOURCE_EXHAUSTED), whatever the keys.
inline constexpr absl::string_view kOversizedMetadata("\0oversized", 10);

// The key of an `authorization` header's value ("Bearer KEY"; the scheme's case is free), or why
// there is none: UNAUTHENTICATED with a message that never holds the header's value.
absl::StatusOr<absl::string_view> BearerToken(absl::string_view authorization);

// The key set in use, shared by every front end, reloaded from its file. Thread-safe.
class ApiKeys {
 public:
  // Called after each reload attempt whose file changed: OK with the new set's size, or why the file
  // was refused (the set in use stays).
  using Listener = std::function<void(const absl::Status& reload, size_t keys_in_use)>;

  // `initial`: what LoadApiKeys accepted at start-up. `check_every` > 0: a thread of its own looks
  // at the file that often and reloads it when its size or time changed; 0: only Reload() does.
  // `allow_empty`: a reload to an empty set is taken (a server locked on purpose), not refused.
  ApiKeys(std::string path, ApiKeySet initial, absl::Duration check_every, Listener listener, bool allow_empty = false);
  ~ApiKeys();
  ApiKeys(const ApiKeys&) = delete;
  ApiKeys& operator=(const ApiKeys&) = delete;

  // The key that `authorization` (the header's value, "" when absent) presents, if it allows
  // `scope`: UNAUTHENTICATED without a valid key, PERMISSION_DENIED naming the key and the scope it
  // lacks. The key stays valid as long as the pointer is held, reloads or not.
  absl::StatusOr<std::shared_ptr<const ApiKey>> Authorize(absl::string_view authorization, Scope scope) const;
  // Authorize's two halves: the key `authorization` presents (UNAUTHENTICATED without a valid one),
  // and whether it has `scope` (PERMISSION_DENIED naming the key and the scope).
  absl::StatusOr<std::shared_ptr<const ApiKey>> Find(absl::string_view authorization) const;
  static absl::Status CheckScope(const ApiKey& key, Scope scope);

  // Reads the file again now (SIGHUP); the result goes to the listener as well.
  absl::Status Reload();

  // The names of the keys in use (the metrics' label values).
  std::vector<std::string> names() const;
  uint64_t reload_failures() const { return failures_.load(); }

 private:
  void WatchLoop();
  std::string Stamp() const;

  const std::string path_;
  const bool allow_empty_;
  const absl::Duration check_every_;
  const Listener listener_;
  mutable Mutex mu_;
  std::shared_ptr<const ApiKeySet> set_ ABSL_GUARDED_BY(mu_);
  Mutex reload_mu_;  // one reload at a time (the watcher and a SIGHUP)
  CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> failures_{0};
  std::thread watcher_;
};

}  // namespace qvi

#endif  // QVI_SERVER_AUTH_API_KEYS_H_
