#include "server/auth/api_keys.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

// printf %s KEY | sha256sum
constexpr char kOneHash[] = "9b346041bc9a49574eb2665b2ad2a0a3f9f9cce4e42f5d1f26deb8a256b5966a";  // key-one
constexpr char kTwoHash[] = "c8df51469c308a59bfbd48a3e0bdd228ca922d6032035f5ef6e4ad45f473a9f3";  // key-two

std::string Keys(const std::string& entries) { return absl::StrCat(R"({"keys": [)", entries, "]}"); }
std::string Entry(const std::string& name, const std::string& hash, const std::string& scopes) {
  return absl::StrCat(R"({"name": ")", name, R"(", "sha256": ")", hash, R"(", "scopes": )", scopes, "}");
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<ApiKeySet> set = ParseApiKeys(text, "keys.json");
  EXPECT_FALSE(set.ok()) << text;
  return set.ok() ? "" : std::string(set.status().message());
}

TEST(ApiKeysTest, AFileNamesEachKeyItsHashAndItsScopes) {
  absl::StatusOr<ApiKeySet> set = ParseApiKeys(
      Keys(Entry("search", kOneHash, R"(["infer", "read"])") + "," + Entry("ops", kTwoHash, R"(["admin"])")), "k");
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->keys.size(), 2u);
  EXPECT_EQ(set->keys[0].name, "search");
  EXPECT_TRUE(set->keys[0].allows(Scope::kInfer));
  EXPECT_TRUE(set->keys[0].allows(Scope::kRead));
  EXPECT_FALSE(set->keys[0].allows(Scope::kAdmin));
  EXPECT_EQ(set->keys[0].ScopeList(), "infer, read");
  EXPECT_EQ(set->keys[1].ScopeList(), "admin");
  // An empty set refuses every call: the likely mistake, unless a locked server is meant.
  EXPECT_EQ(ErrorOf(Keys("")),
            "keys.json: keys is empty, which would refuse every call but the probes; to lock the server on purpose, "
            "start it with --api-keys-allow-empty");
  absl::StatusOr<ApiKeySet> locked = ParseApiKeys(Keys(""), "k", /*allow_empty=*/true);
  ASSERT_TRUE(locked.ok()) << locked.status();
  EXPECT_TRUE(locked->keys.empty());
}

TEST(ApiKeysTest, AFileWithAMistakeIsRefusedNamingTheKeyAndTheField) {
  EXPECT_EQ(ErrorOf("{"), "keys.json: not valid JSON");
  EXPECT_EQ(ErrorOf("[]"), R"(keys.json: must be an object {"keys": [...]})");
  EXPECT_EQ(ErrorOf(R"({"keys": [], "key": 1})"),
            R"(keys.json: has the field "key", which is none of "keys", "default_limits")");
  EXPECT_EQ(ErrorOf(Keys(Entry("a b", kOneHash, R"(["infer"])"))),
            "keys.json: keys[0].name must be 1 to 64 of A-Z a-z 0-9 . _ - (it names the key in logs and metrics)");
  EXPECT_EQ(ErrorOf(Keys(R"({"sha256": "00"})")), R"(keys.json: keys[0] has no "name")");
  EXPECT_EQ(ErrorOf(Keys(Entry("a", "abc", R"(["infer"])"))),
            "keys.json: keys[0] (a).sha256 must be 64 hex digits (the key's SHA-256, as sha256sum prints it), got 3 "
            "characters");
  EXPECT_EQ(ErrorOf(Keys(Entry("a", kOneHash, R"(["infer", "write"])"))),
            R"(keys.json: keys[0] (a).scopes has "write", which is none of "infer", "read", "admin")");
  EXPECT_EQ(ErrorOf(Keys(Entry("a", kOneHash, "[]"))),
            R"(keys.json: keys[0] (a).scopes must be a non-empty list of "infer", "read", "admin")");
  EXPECT_EQ(ErrorOf(Keys(R"({"name": "a", "sha256": ")" + std::string(kOneHash) + R"(", "scope": ["read"]})")),
            R"(keys.json: keys[0] (a) has the field "scope", which is none of "name", "sha256", "scopes", "limits", )"
            R"("priority", "max_priority")");
  EXPECT_EQ(ErrorOf(Keys(R"({"name": "a", "sha256": ")" + std::string(kOneHash) + R"("})")),
            R"(keys.json: keys[0] (a) has no "scopes")");
  EXPECT_EQ(ErrorOf(Keys(Entry("a", kOneHash, R"(["read"])") + "," + Entry("a", kTwoHash, R"(["read"])"))),
            R"(keys.json: keys[1] has the name "a" of an earlier key; names must be unique)");
  EXPECT_EQ(ErrorOf(Keys(Entry("a", kOneHash, R"(["read"])") + "," + Entry("b", kOneHash, R"(["read"])"))),
            "keys.json: keys[1] (b) has the sha256 of an earlier key; each key must be its own");
  std::string many;
  for (size_t i = 0; i <= ApiKeySet::kMaxKeys; ++i) {
    many += absl::StrCat(i == 0 ? "" : ",", R"({"name": "k)", i, R"(", "sha256": "00", "scopes": ["read"]})");
  }
  EXPECT_EQ(ErrorOf(Keys(many)), "keys.json: keys holds 1001 keys, more than the limit of 1000");
}

std::string WithPriority(const std::string& fields) {
  return Keys(absl::StrCat(R"({"name": "bulk", "sha256": ")", kOneHash, R"(", "scopes": ["infer"], )", fields, "}"));
}

TEST(ApiKeysTest, AKeySetsItsRequestsDefaultPriorityAndTheHighestTheyMayAskFor) {
  absl::StatusOr<ApiKeySet> set = ParseApiKeys(WithPriority(R"("priority": "low", "max_priority": 2)"), "k");
  ASSERT_TRUE(set.ok()) << set.status();
  const ApiKey& bulk = set->keys[0];
  EXPECT_EQ(bulk.priority, Priority::kLow);
  EXPECT_EQ(bulk.max_priority, Priority::kNormal);
  EXPECT_EQ(KeyPriority(bulk, Priority::kDefault).value(), Priority::kLow) << "a request naming none: the key's";
  EXPECT_EQ(KeyPriority(bulk, Priority::kNormal).value(), Priority::kNormal);
  EXPECT_EQ(KeyPriority(bulk, Priority::kLow).value(), Priority::kLow);
  const absl::Status above = KeyPriority(bulk, Priority::kHigh).status();
  EXPECT_EQ(above.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(above.message(), "priority: API key 'bulk' may ask for normal priority at most, not high");

  // Without "priority": normal, or the key's max_priority when that is lower.
  EXPECT_EQ(ParseApiKeys(WithPriority(R"("max_priority": "low")"), "k")->keys[0].priority, Priority::kLow);
  EXPECT_EQ(ParseApiKeys(WithPriority(R"("max_priority": "high")"), "k")->keys[0].priority, Priority::kNormal);
  const ApiKey plain = ParseApiKeys(Keys(Entry("app", kOneHash, R"(["infer"])")), "k")->keys[0];
  EXPECT_EQ(plain.priority, Priority::kNormal);
  EXPECT_EQ(KeyPriority(plain, Priority::kHigh).value(), Priority::kHigh) << "any priority by default";

  EXPECT_EQ(ErrorOf(WithPriority(R"("priority": "urgent")")),
            R"(keys.json: keys[0] (bulk).priority must be "high", "normal" or "low" (or 1, 2, 3))");
  EXPECT_EQ(ErrorOf(WithPriority(R"("max_priority": 0)")),
            R"(keys.json: keys[0] (bulk).max_priority must be "high", "normal" or "low" (or 1, 2, 3))");
  EXPECT_EQ(ErrorOf(WithPriority(R"("priority": "high", "max_priority": "low")")),
            "keys.json: keys[0] (bulk).priority is high, above its max_priority (low)");
}

TEST(ApiKeysTest, TheKeyIsFoundByItsHash) {
  absl::StatusOr<ApiKeySet> set =
      ParseApiKeys(Keys(Entry("one", kOneHash, R"(["read"])") + "," + Entry("two", kTwoHash, R"(["read"])")), "k");
  ASSERT_TRUE(set.ok());
  ASSERT_NE(MatchKey(*set, "key-two"), nullptr);
  EXPECT_EQ(MatchKey(*set, "key-two")->name, "two");
  EXPECT_EQ(MatchKey(*set, "key-one")->name, "one");
  EXPECT_EQ(MatchKey(*set, "key-twO"), nullptr);
  EXPECT_EQ(MatchKey(*set, ""), nullptr);
  EXPECT_EQ(MatchKey(*set, kTwoHash), nullptr) << "the hash itself is not the key";
}

TEST(ApiKeysTest, OnlyABearerHeaderCarriesAKey) {
  EXPECT_EQ(BearerToken("Bearer key-one").value(), "key-one");
  EXPECT_EQ(BearerToken("bearer   key-one ").value(), "key-one");
  for (const char* header : {"", "Basic key-one", "key-one", "Bearer ", "Bearer"}) {
    absl::StatusOr<absl::string_view> token = BearerToken(header);
    ASSERT_FALSE(token.ok()) << header;
    EXPECT_EQ(token.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_NE(token.status().message().find("authorization: Bearer <key>"), absl::string_view::npos);
    EXPECT_EQ(token.status().message().find("key-one"), absl::string_view::npos) << "never repeats the key";
  }
}

class ReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("api_keys_test_", ::testing::UnitTest::GetInstance()->random_seed(), "_", getpid());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "keys.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(ReloadTest, ACallIsAuthorizedByItsKeysScopeAndTheRefusalsNeverRepeatTheKey) {
  Write(Keys(Entry("search", kOneHash, R"(["infer", "read"])")));
  absl::StatusOr<ApiKeySet> initial = LoadApiKeys(path_);
  ASSERT_TRUE(initial.ok()) << initial.status();
  ApiKeys keys(path_, std::move(*initial), absl::ZeroDuration(), nullptr);

  auto ok = keys.Authorize("Bearer key-one", Scope::kInfer);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->name, "search");

  auto denied = keys.Authorize("Bearer key-one", Scope::kAdmin);
  ASSERT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.status().message(),
            "the API key 'search' lacks the scope 'admin' this call needs (it has: infer, read)");

  auto unknown = keys.Authorize("Bearer key-two", Scope::kRead);
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unknown.status().message().find("key-two"), absl::string_view::npos);
  EXPECT_EQ(keys.Authorize("", Scope::kRead).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(ReloadTest, AReloadTakesANewSetAndABadFileKeepsTheOldOne) {
  Write(Keys(Entry("one", kOneHash, R"(["read"])")));
  std::vector<std::pair<absl::Status, size_t>> heard;
  ApiKeys keys(path_, *LoadApiKeys(path_), absl::ZeroDuration(),
               [&](const absl::Status& s, size_t n) { heard.emplace_back(s, n); });
  auto held = keys.Authorize("Bearer key-one", Scope::kRead);
  ASSERT_TRUE(held.ok());

  // Rotation: key-two added, key-one withdrawn.
  Write(Keys(Entry("two", kTwoHash, R"(["read"])")));
  ASSERT_TRUE(keys.Reload().ok());
  EXPECT_TRUE(keys.Authorize("Bearer key-two", Scope::kRead).ok());
  EXPECT_EQ(keys.Authorize("Bearer key-one", Scope::kRead).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*held)->name, "one") << "a key a call holds outlives the set it came from";
  EXPECT_EQ(keys.names(), std::vector<std::string>{"two"});

  // A half-written file: refused, the set in use stays, the failure is counted and heard.
  Write(R"({"keys": [{"name": "thr)");
  absl::Status bad = keys.Reload();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("not valid JSON"), absl::string_view::npos);
  EXPECT_TRUE(keys.Authorize("Bearer key-two", Scope::kRead).ok());
  EXPECT_EQ(keys.reload_failures(), 1u);
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_TRUE(heard[0].first.ok());
  EXPECT_EQ(heard[1].first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(heard[1].second, 1u);

  // A file emptied of keys: refused like any bad file, the set in use stays.
  Write(Keys(""));
  absl::Status emptied = keys.Reload();
  EXPECT_EQ(emptied.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(emptied.message().find("--api-keys-allow-empty"), absl::string_view::npos) << emptied;
  EXPECT_TRUE(keys.Authorize("Bearer key-two", Scope::kRead).ok());

  std::filesystem::remove(path_);
  EXPECT_EQ(keys.Reload().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(keys.Authorize("Bearer key-two", Scope::kRead).ok());
}

TEST_F(ReloadTest, AServerLockedOnPurposeTakesAnEmptySetOnReload) {
  Write(Keys(Entry("one", kOneHash, R"(["read"])")));
  ApiKeys keys(path_, *LoadApiKeys(path_), absl::ZeroDuration(), nullptr, /*allow_empty=*/true);
  Write(Keys(""));
  ASSERT_TRUE(keys.Reload().ok());
  EXPECT_TRUE(keys.names().empty());
  EXPECT_EQ(keys.Authorize("Bearer key-one", Scope::kRead).status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace qvi
