#include "server/auth/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qvi {
namespace {

constexpr Scope kScopes[] = {Scope::kInfer, Scope::kRead, Scope::kAdmin};

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

absl::Status ParseSha256(const nlohmann::json& value, std::array<unsigned char, 32>& out) {
  if (!value.is_string()) return absl::InvalidArgumentError("must be a string of 64 hex digits");
  const std::string hex = value.get<std::string>();
  if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be 64 hex digits (the key's SHA-256, as sha256sum prints it), got ", hex.size(), " characters"));
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return absl::OkStatus();
}

absl::StatusOr<uint8_t> ParseScopes(const nlohmann::json& value) {
  if (!value.is_array() || value.empty()) {
    return absl::InvalidArgumentError("must be a non-empty list of \"infer\", \"read\", \"admin\"");
  }
  uint8_t scopes = 0;
  for (const nlohmann::json& item : value) {
    bool known = false;
    for (Scope s : kScopes) {
      if (item.is_string() && item.get<std::string>() == ScopeName(s)) {
        scopes |= static_cast<uint8_t>(s);
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("has ", item.dump().substr(0, 40), ", which is none of \"infer\", \"read\", \"admin\""));
    }
  }
  return scopes;
}

// "limits" of a key, or the file's "default_limits"; `where` ("--api-keys F: keys[0] (app).limits")
// starts each error.
absl::StatusOr<RateLimits> ParseLimits(const nlohmann::json& value, const std::string& where) {
  constexpr absl::string_view kFields =
      "\"requests_per_second\", \"texts_per_second\", \"tokens_per_second\", \"burst_seconds\"";
  if (!value.is_object() || value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be an object with some of ", kFields));
  }
  RateLimits limits;
  for (const auto& [field, v] : value.items()) {
    double* out = field == "requests_per_second" ? &limits.requests_per_second
                  : field == "texts_per_second"  ? &limits.texts_per_second
                  : field == "tokens_per_second" ? &limits.tokens_per_second
                  : field == "burst_seconds"     ? &limits.burst_seconds
                                                 : nullptr;
    if (out == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has the field \"", field.substr(0, 40), "\", which is none of ", kFields));
    }
    const bool burst = field == "burst_seconds";
    const double low = burst ? 0.01 : 0, high = burst ? 3600 : 1e9;
    if (!v.is_number() || v.get<double>() <= low || v.get<double>() > high) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", field, " must be a number over ", low, " and at most ",
                                                     high, ", got ", v.dump().substr(0, 40)));
    }
    *out = v.get<double>();
  }
  if (!limits.any()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " sets only burst_seconds: give requests_per_second, texts_per_second or tokens_per_second"));
  }
  return limits;
}

// "priority" / "max_priority": "high", "normal", "low" or 1 to 3.
absl::StatusOr<Priority> ParseKeyPriority(const nlohmann::json& value) {
  absl::StatusOr<Priority> p = absl::InvalidArgumentError("");
  if (value.is_string()) p = ParsePriority(value.get<std::string>(), "priority");
  if (value.is_number_integer()) p = PriorityFromNumber(value.get<int64_t>(), "priority");
  if (!p.ok() || *p == Priority::kDefault) {
    return absl::InvalidArgumentError("must be \"high\", \"normal\" or \"low\" (or 1, 2, 3)");
  }
  return *p;
}

// Without "priority", the key's requests queue at normal, or at its max_priority when that is lower;
// a "priority" above its max_priority is an error.
absl::Status SettlePriority(bool has_priority, ApiKey& key) {
  if (!has_priority) {
    key.priority =
        PriorityLevel(key.max_priority) > PriorityLevel(Priority::kNormal) ? key.max_priority : Priority::kNormal;
  } else if (PriorityLevel(key.priority) < PriorityLevel(key.max_priority)) {
    return absl::InvalidArgumentError(absl::StrCat("is ", PriorityName(key.priority), ", above its max_priority (",
                                                   PriorityName(key.max_priority), ")"));
  }
  return absl::OkStatus();
}

// One entry of "keys"; `where` is "keys[3]" or "keys[3] (search-app)".
absl::StatusOr<ApiKey> ParseKey(const nlohmann::json& entry, const std::string& at, absl::string_view source) {
  const auto bad = [&](const std::string& where, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", where, " ", what));
  };
  if (!entry.is_object()) return bad(at, "must be an object with \"name\", \"sha256\" and \"scopes\"");
  ApiKey key;
  std::string where = at;
  if (auto name = entry.find("name"); name != entry.end()) {
    if (!name->is_string() || !ValidName(name->get<std::string>())) {
      return bad(at + ".name", "must be 1 to 64 of A-Z a-z 0-9 . _ - (it names the key in logs and metrics)");
    }
    key.name = name->get<std::string>();
    where = absl::StrCat(at, " (", key.name, ")");
  } else {
    return bad(at, "has no \"name\"");
  }
  for (const auto& [field, value] : entry.items()) {
    absl::Status s;
    if (field == "name") {
      continue;
    } else if (field == "sha256") {
      s = ParseSha256(value, key.sha256);
    } else if (field == "scopes") {
      absl::StatusOr<uint8_t> scopes = ParseScopes(value);
      s = scopes.status();
      if (scopes.ok()) key.scopes = *scopes;
    } else if (field == "limits") {
      absl::StatusOr<RateLimits> limits = ParseLimits(value, absl::StrCat(source, ": ", where, ".limits"));
      if (!limits.ok()) return limits.status();
      key.limits = *limits;
      key.own_limits = true;
    } else if (field == "priority" || field == "max_priority") {
      absl::StatusOr<Priority> p = ParseKeyPriority(value);
      s = p.status();
      if (p.ok()) (field == "priority" ? key.priority : key.max_priority) = *p;
    } else {
      return bad(where, absl::StrCat("has the field \"", field.substr(0, 40),
                                     "\", which is none of \"name\", \"sha256\", \"scopes\", \"limits\", "
                                     "\"priority\", \"max_priority\""));
    }
    if (!s.ok()) return bad(absl::StrCat(where, ".", field), s.message());
  }
  if (!entry.contains("sha256")) return bad(where, "has no \"sha256\"");
  if (!entry.contains("scopes")) return bad(where, "has no \"scopes\"");
  if (absl::Status s = SettlePriority(entry.contains("priority"), key); !s.ok()) {
    return bad(where + ".priority", s.message());
  }
  return key;
}

uint64_t Prefix(const std::array<unsigned char, 32>& digest) {
  uint64_t prefix = 0;
  std::memcpy(&prefix, digest.data(), sizeof(prefix));
  return prefix;
}

std::array<unsigned char, 32> Sha256(absl::string_view text) {
  std::array<unsigned char, 32> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

}  // namespace

absl::string_view ScopeName(Scope scope) {
  switch (scope) {
    case Scope::kInfer:
      return "infer";
    case Scope::kRead:
      return "read";
    case Scope::kAdmin:
      return "admin";
  }
  return "?";
}

std::string ApiKey::ScopeList() const {
  std::vector<absl::string_view> names;
  for (Scope s : kScopes) {
    if (allows(s)) names.push_back(ScopeName(s));
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<ApiKeySet> ParseApiKeys(absl::string_view text, absl::string_view source, bool allow_empty) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": must be an object {\"keys\": [...]}"));
  }
  RateLimits defaults;
  for (const auto& [field, value] : doc.items()) {
    if (field == "default_limits") {
      absl::StatusOr<RateLimits> limits = ParseLimits(value, absl::StrCat(source, ": default_limits"));
      if (!limits.ok()) return limits.status();
      defaults = *limits;
    } else if (field != "keys") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": has the field \"", field.substr(0, 40),
                                                     "\", which is none of \"keys\", \"default_limits\""));
    }
  }
  const nlohmann::json& keys = doc["keys"];
  if (keys.empty() && !allow_empty) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": keys is empty, which would refuse every call but the probes; to lock the server on purpose, start "
        "it with --api-keys-allow-empty"));
  }
  if (keys.size() > ApiKeySet::kMaxKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": keys holds ", keys.size(), " keys, more than the limit of ", ApiKeySet::kMaxKeys));
  }
  ApiKeySet set;
  std::set<std::string> names;
  std::set<std::array<unsigned char, 32>> hashes;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<ApiKey> key = ParseKey(keys[i], absl::StrCat("keys[", i, "]"), source);
    if (!key.ok()) return key.status();
    if (!names.insert(key->name).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": keys[", i, "] has the name \"", key->name,
                                                     "\" of an earlier key; names must be unique"));
    }
    if (!hashes.insert(key->sha256).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": keys[", i, "] (", key->name,
                                                     ") has the sha256 of an earlier key; each key must be its own"));
    }
    if (!key->own_limits) key->limits = defaults;
    set.by_prefix.emplace(Prefix(key->sha256), set.keys.size());
    set.keys.push_back(std::move(*key));
  }
  return set;
}

absl::StatusOr<Priority> KeyPriority(const ApiKey& key, Priority asked) {
  if (asked == Priority::kDefault || !IsPriority(asked)) return asked == Priority::kDefault ? key.priority : asked;
  if (PriorityLevel(asked) < PriorityLevel(key.max_priority)) {
    return absl::PermissionDeniedError(absl::StrCat("priority: API key '", key.name, "' may ask for ",
                                                    PriorityName(key.max_priority), " priority at most, not ",
                                                    PriorityName(asked)));
  }
  return asked;
}

absl::StatusOr<ApiKeySet> LoadApiKeys(const std::string& path, bool allow_empty) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--api-keys: cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  constexpr size_t kMaxBytes = 1 << 20;
  if (text.str().size() > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys: ", path, " is over ", kMaxBytes, " bytes"));
  }
  return ParseApiKeys(text.str(), absl::StrCat("--api-keys ", path), allow_empty);
}

const ApiKey* MatchKey(const ApiKeySet& set, absl::string_view presented) {
  const std::array<unsigned char, 32> digest = Sha256(presented);
  const auto [first, last] = set.by_prefix.equal_range(Prefix(digest));
  for (auto it = first; it != last; ++it) {
    const ApiKey& key = set.keys[it->second];
    // CRYPTO_memcmp takes the same time whatever the bytes.
    if (CRYPTO_memcmp(key.sha256.data(), digest.data(), digest.size()) == 0) return &key;
  }
  return nullptr;
}

absl::StatusOr<absl::string_view> BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kHint = "send the header 'authorization: Bearer <key>'";
  if (authorization == kRepeatedAuthorization) {
    return absl::UnauthenticatedError("the call carries the authorization header more than once; send it once");
  }
  if (authorization.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("this server wants an API key (--api-keys): ", kHint));
  }
  const size_t space = authorization.find(' ');
  if (space == absl::string_view::npos || !absl::EqualsIgnoreCase(authorization.substr(0, space), "bearer")) {
    return absl::UnauthenticatedError(absl::StrCat("the authorization header is not of the Bearer scheme: ", kHint));
  }
  absl::string_view token = absl::StripAsciiWhitespace(authorization.substr(space + 1));
  if (token.empty()) return absl::UnauthenticatedError(absl::StrCat("the Bearer key is empty: ", kHint));
  return token;
}

ApiKeys::ApiKeys(std::string path, ApiKeySet initial, absl::Duration check_every, Listener listener, bool allow_empty)
    : path_(std::move(path)),
      allow_empty_(allow_empty),
      check_every_(check_every),
      listener_(std::move(listener)),
      set_(std::make_shared<const ApiKeySet>(std::move(initial))) {
  if (check_every_ > absl::ZeroDuration()) watcher_ = std::thread([this] { WatchLoop(); });
}

ApiKeys::~ApiKeys() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_cv_.SignalAll();
  if (watcher_.joinable()) watcher_.join();
}

absl::StatusOr<std::shared_ptr<const ApiKey>> ApiKeys::Find(absl::string_view authorization) const {
  absl::StatusOr<absl::string_view> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  std::shared_ptr<const ApiKeySet> set;
  {
    MutexLock lock(&mu_);
    set = set_;
  }
  const ApiKey* key = MatchKey(*set, *token);
  if (key == nullptr) {
    return absl::UnauthenticatedError("the API key is not one this server holds (--api-keys)");
  }
  return std::shared_ptr<const ApiKey>(std::move(set), key);  // shares the set's lifetime
}

absl::Status ApiKeys::CheckScope(const ApiKey& key, Scope scope) {
  if (key.allows(scope)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("the API key '", key.name, "' lacks the scope '", ScopeName(scope),
                                                  "' this call needs (it has: ", key.ScopeList(), ")"));
}

absl::StatusOr<std::shared_ptr<const ApiKey>> ApiKeys::Authorize(absl::string_view authorization, Scope scope) const {
  absl::StatusOr<std::shared_ptr<const ApiKey>> key = Find(authorization);
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckScope(**key, scope); !s.ok()) return s;
  return key;
}

std::vector<std::string> ApiKeys::names() const {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const ApiKey& key : set_->keys) names.push_back(key.name);
  return names;
}

absl::Status ApiKeys::Reload() {
  MutexLock one(&reload_mu_);
  absl::StatusOr<ApiKeySet> set = LoadApiKeys(path_, allow_empty_);
  size_t in_use = 0;
  {
    MutexLock lock(&mu_);
    if (set.ok()) set_ = std::make_shared<const ApiKeySet>(std::move(*set));
    in_use = set_->keys.size();
  }
  if (!set.ok()) ++failures_;
  if (listener_) listener_(set.status(), in_use);
  return set.status();
}

std::string ApiKeys::Stamp() const {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return "missing";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

void ApiKeys::WatchLoop() {
  std::string seen = Stamp();
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + check_every_;
      while (!stopping_ && absl::Now() < until) stop_cv_.WaitWithTimeout(&mu_, until - absl::Now());
      if (stopping_) return;
    }
    // A Secret mounted by Kubernetes changes by a symlink swap: the inode changes, so stat follows it.
    const std::string stamp = Stamp();
    if (stamp == seen) continue;
    seen = stamp;
    (void)Reload();
  }
}

}  // namespace qvi
