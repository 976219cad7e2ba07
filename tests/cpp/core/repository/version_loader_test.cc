// A version's lifecycle alone (version_loader.h): the load with its deadline, abandoned and cancelled
// loads, and the servable freed on the unloader thread.
#include "server/core/repository/version_loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "tests/cpp/test_util/fake_env.h"
#include "tests/cpp/test_util/fake_model.h"

namespace qvi {
namespace {

constexpr absl::Duration kBounded = absl::Seconds(30);  // real time: only a broken loader waits this long

struct Unload {
  std::string name;
  int64_t version;
  uint64_t generation;
  std::thread::id thread;
};

class VersionLoaderTest : public ::testing::Test {
 protected:
  VersionLoader::Options Options(VersionLoader::LoadFn load) {
    VersionLoader::Options o;
    o.env = &env_;
    o.load_timeout = absl::Seconds(10);
    o.load = std::move(load);
    o.unloaded = [this](const std::string& name, int64_t version, uint64_t generation) {
      MutexLock lock(&mu_);
      unloads_.push_back({name, version, generation, std::this_thread::get_id()});
    };
    return o;
  }
  std::vector<Unload> Unloads() {
    MutexLock lock(&mu_);
    return unloads_;
  }
  // A load that returns the model named `name`.
  static VersionLoader::LoadFn Returns(std::string name) {
    return [name](const std::string&, const LoadOptions&) -> absl::StatusOr<std::unique_ptr<Model>> {
      return std::unique_ptr<Model>(FakeModel::Create(name));
    };
  }
  // A load that signals `entered`, then blocks until `released` (shared: the load's thread may outlive
  // the test's scope until it has returned).
  struct Gate {
    absl::Notification entered, released;
  };
  static VersionLoader::LoadFn Blocks(std::shared_ptr<Gate> gate) {
    return [gate](const std::string&, const LoadOptions&) -> absl::StatusOr<std::unique_ptr<Model>> {
      gate->entered.Notify();
      gate->released.WaitForNotificationWithTimeout(kBounded);
      return std::unique_ptr<Model>(FakeModel::Create("m"));
    };
  }
  // Until the abandoned loads have returned (their threads touch the environment until then).
  static bool Returned(const VersionLoader& loader) {
    const absl::Time until = absl::Now() + kBounded;
    while (!loader.StillRunning().empty() && absl::Now() < until) std::this_thread::yield();
    return loader.StillRunning().empty();
  }

  FakeEnv env_;
  Mutex mu_;
  std::vector<Unload> unloads_ ABSL_GUARDED_BY(mu_);
};

TEST_F(VersionLoaderTest, AServableIsFreedOnTheUnloaderThreadOnceItsLastHandleGoes) {
  VersionLoader loader(Options(Returns("m")));
  absl::StatusOr<ServableHandle> servable = loader.Load("m", 3, 17, "/store/m/3", ServingOverrides{});
  ASSERT_TRUE(servable.ok()) << servable.status();
  EXPECT_EQ((*servable)->name, "m");
  EXPECT_EQ((*servable)->version, 3);
  EXPECT_EQ((*servable)->generation, 17u);
  ASSERT_NE((*servable)->runner, nullptr);
  ServableHandle request = *servable;  // a request's hold
  servable->reset();
  EXPECT_TRUE(Unloads().empty());  // the request still holds it
  request.reset();
  loader.Stop();  // returns once every servable made is freed
  std::vector<Unload> unloads = Unloads();
  ASSERT_EQ(unloads.size(), 1u);
  EXPECT_EQ(unloads[0].name, "m");
  EXPECT_EQ(unloads[0].version, 3);
  EXPECT_EQ(unloads[0].generation, 17u);
  EXPECT_NE(unloads[0].thread, std::this_thread::get_id());
}

TEST_F(VersionLoaderTest, AManifestNamingAnotherModelFailsTheLoad) {
  VersionLoader loader(Options(Returns("other")));
  absl::StatusOr<ServableHandle> servable = loader.Load("m", 1, 1, "/store/m/1", ServingOverrides{});
  EXPECT_EQ(servable.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(servable.status().message().find("manifest.json names the model 'other' but it sits in the folder 'm'"),
            std::string::npos)
      << servable.status();
}

TEST_F(VersionLoaderTest, ALoadPastItsTimeoutIsAbandonedAndListedUntilItReturns) {
  auto gate = std::make_shared<Gate>();
  VersionLoader loader(Options(Blocks(gate)));
  absl::StatusOr<ServableHandle> result;
  std::thread caller([&] { result = loader.Load("m", 2, 1, "/store/m/2", ServingOverrides{}); });
  ASSERT_TRUE(gate->entered.WaitForNotificationWithTimeout(kBounded));  // its time counts from before this
  env_.Advance(absl::Seconds(11));
  caller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("did not finish within 10s"), std::string::npos) << result.status();
  EXPECT_EQ(loader.StillRunning(), std::vector<std::string>({"m@2 (running for 11 s)"}));
  gate->released.Notify();  // the abandoned load returns: its model is freed on its own thread
  EXPECT_TRUE(Returned(loader));
  loader.Stop();
  EXPECT_TRUE(Unloads().empty());  // no servable was made of it
}

TEST_F(VersionLoaderTest, CancelEndsTheLoadsWaitedForAndRefusesNewOnes) {
  auto gate = std::make_shared<Gate>();
  VersionLoader loader(Options(Blocks(gate)));
  absl::StatusOr<ServableHandle> result;
  std::thread caller([&] { result = loader.Load("m", 1, 1, "/store/m/1", ServingOverrides{}); });
  ASSERT_TRUE(gate->entered.WaitForNotificationWithTimeout(kBounded));
  loader.Cancel();
  caller.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(result.status().message().find("loading abandoned: the server is shutting down"), std::string::npos);
  absl::StatusOr<ServableHandle> next = loader.Load("m", 1, 2, "/store/m/1", ServingOverrides{});
  EXPECT_EQ(next.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(next.status().message().find("not loaded: the server is shutting down"), std::string::npos);
  gate->released.Notify();
  EXPECT_TRUE(Returned(loader));
}

TEST_F(VersionLoaderTest, AThrowingLoadIsAnErrorNamingItsFolder) {
  VersionLoader loader(Options([](const std::string&, const LoadOptions&) -> absl::StatusOr<std::unique_ptr<Model>> {
    throw std::runtime_error("bad bytes");
  }));
  absl::StatusOr<ServableHandle> servable = loader.Load("m", 1, 1, "/store/m/1", ServingOverrides{});
  EXPECT_EQ(servable.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(servable.status().message().find("loading /store/m/1 failed: "), std::string::npos) << servable.status();
  EXPECT_NE(servable.status().message().find("bad bytes"), std::string::npos) << servable.status();
}

}  // namespace
}  // namespace qvi
