// The manager's parts on a hand-made shared state (repository_state.h), no model loaded and no thread
// started: what the catalog tells a request of each state, and how the admin's control queues its polls.
// The parts working together, with real loads, are model_repository_test.cc's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "server/core/repository/admin_control.h"
#include "server/core/repository/catalog.h"
#include "server/core/repository/repository_state.h"
#include "server/core/repository/repository_types.h"
#include "tests/cpp/test_util/fake_env.h"

namespace qvi {
namespace {

namespace fs = std::filesystem;

class RepositoryPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("qvi_parts_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "in-store" / "1");
    std::ofstream(root_ / "in-store" / "1" / "model.pt") << "not read here";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::unique_ptr<RepositoryState> State(ModelControl control, bool load_on_demand = false) {
    RepositoryOptions o;
    o.root = root_.string();
    o.env = &env_;
    o.model_control = control;
    o.load_on_demand = load_on_demand;
    return std::make_unique<RepositoryState>(std::move(o));
  }
  // A version of `name` in `state` as the manager records it; READY ones get a servable (no model).
  static void Put(RepositoryState& s, const std::string& name, int64_t version, ModelState state,
                  const std::string& reason = "") {
    MutexLock lock(&s.mu);
    RepositoryState::Record& r = s.models[name].versions[version];
    r.status = VersionStatus{version, state, reason, nullptr, {}};
    if (state == ModelState::kReady) {
      auto servable = std::make_shared<Servable>();
      servable->name = name;
      servable->version = version;
      r.servable = servable;
    }
  }

  fs::path root_;
  FakeEnv env_;
};

TEST_F(RepositoryPartsTest, TheCatalogResolvesTheNewestReadyVersionOrSaysWhyNone) {
  auto s = State(ModelControl::kPoll);
  Put(*s, "m", 1, ModelState::kReady);
  Put(*s, "m", 2, ModelState::kReady);
  Put(*s, "m", 3, ModelState::kFailed, "corrupt file");
  Catalog catalog(s.get());
  absl::StatusOr<ServableHandle> newest = catalog.Resolve("m", 0);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)->version, 2);
  EXPECT_EQ((*newest)->last_used_ns.load(), absl::ToUnixNanos(env_.Now()));  // a use the budget's LRU sees
  absl::StatusOr<ServableHandle> failed = catalog.Resolve("m", 3);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.status().message(), "model 'm' version 3 is FAILED: corrupt file");
  absl::StatusOr<ServableHandle> missing = catalog.Resolve("m", 7);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("has no version 7; versions: 1, 2, 3"), std::string::npos)
      << missing.status();
  absl::StatusOr<ServableHandle> unknown = catalog.Resolve("other", 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), "model 'other' not found; models: m");
  EXPECT_TRUE(catalog.Has("m"));
  EXPECT_FALSE(catalog.Has("other"));
  ASSERT_EQ(catalog.List().size(), 1u);
  EXPECT_EQ(catalog.List()[0].versions.front().version, 3);  // newest first
}

TEST_F(RepositoryPartsTest, TheCatalogSaysAModelInTheStoreIsNotLoadedRestsOrLoadsOnDemand) {
  auto explicit_control = State(ModelControl::kExplicit);
  {
    MutexLock lock(&explicit_control->mu);
    explicit_control->on_disk.insert("in-store");
  }
  absl::StatusOr<ServableHandle> not_loaded = Catalog(explicit_control.get()).Resolve("in-store", 0);
  EXPECT_EQ(not_loaded.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(not_loaded.status().message().find("is not loaded: the server's model control is explicit"),
            std::string::npos)
      << not_loaded.status();
  EXPECT_FALSE(WaitsForLoad(not_loaded.status()));

  auto on_demand = State(ModelControl::kPoll, /*load_on_demand=*/true);
  {
    MutexLock lock(&on_demand->mu);
    on_demand->on_disk.insert("in-store");
    on_demand->resting["in-store"] = "unloaded after 10m without a request";
  }
  absl::StatusOr<ServableHandle> waits = Catalog(on_demand.get()).Resolve("in-store", 0);
  EXPECT_TRUE(WaitsForLoad(waits.status())) << waits.status();
  // The index lists what the store holds, and why a model is not loaded.
  std::vector<ModelStatus> index = Catalog(on_demand.get()).Index();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].name, "in-store");
  EXPECT_EQ(index[0].not_loaded, "unloaded after 10m without a request");
}

TEST_F(RepositoryPartsTest, AnAdminsControlIsRefusedInPollModeAndQueuedAsAPollOtherwiseBehindOneInProgress) {
  auto poll = State(ModelControl::kPoll);
  absl::Status refused;
  AdminControl(poll.get()).Control("in-store", true, LoadCause::kAdmin, [&](const absl::Status& s) { refused = s; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);

  auto s = State(ModelControl::kExplicit);
  AdminControl control(s.get());
  absl::Status missing;
  control.Control("absent", true, LoadCause::kAdmin, [&](const absl::Status& st) { missing = st; });
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("the store holds: in-store"), std::string::npos) << missing;

  int answers = 0;
  control.Control("in-store", true, LoadCause::kAdmin, [&](const absl::Status&) { ++answers; });
  control.Control("in-store", false, LoadCause::kAdmin, [&](const absl::Status&) { ++answers; });
  MutexLock lock(&s->mu);
  EXPECT_EQ(answers, 0);          // each answers once its poll has run
  ASSERT_EQ(s->jobs.size(), 1u);  // the first is a poll of the model; the second waits behind it
  EXPECT_EQ(s->jobs.front().name, "in-store");
  EXPECT_EQ(s->jobs.front().cause, LoadCause::kAdmin);
  EXPECT_TRUE(s->jobs.front().found.has_value());  // wanted when it was queued
  EXPECT_EQ(s->busy.count("in-store"), 1u);
  EXPECT_EQ(s->again["in-store"].size(), 1u);
  EXPECT_EQ(s->wanted.count("in-store"), 0u);  // the unload came last
}

}  // namespace
}  // namespace qvi
