// SelectVersions alone: which versions each policy loads, keeps, takes out of service and forgets,
// and the reasons it gives. No files, threads or models.
#include "server/core/store/version_policy.h"

#include <gtest/gtest.h>

namespace qvi {

// So that a failed expectation shows the version and the reason.
void PrintTo(const VersionActions::Unload& u, std::ostream* os) {
  *os << "{" << u.version << ", \"" << u.reason << "\"}";
}

namespace {

using K = KnownVersion;
using Unload = VersionActions::Unload;

VersionPolicy Policy(const std::string& spec) {
  absl::StatusOr<VersionPolicy> p = VersionPolicy::Parse(spec);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

TEST(SelectVersions, LatestLoadsTheNewestAndNothingLeavesWhileALoadIsPending) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {1, 2}, {{1, K::kReady}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{2}));
  // Version 1 would leave once 2 is READY; the manager applies unloads only from a round with no loads.
  EXPECT_EQ(a.unload, (std::vector<Unload>{{1, "replaced by version 2 (version policy latest:1)"}}));
  EXPECT_TRUE(a.forget.empty());
}

TEST(SelectVersions, LatestReplacesTheOlderOnceTheNewIsReady) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {1, 2}, {{1, K::kReady}, {2, K::kReady}});
  EXPECT_TRUE(a.load.empty());
  EXPECT_EQ(a.unload, (std::vector<Unload>{{1, "replaced by version 2 (version policy latest:1)"}}));
}

TEST(SelectVersions, AFailedNewestIsSkippedSoTheOlderKeepsServing) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {1, 2}, {{1, K::kReady}, {2, K::kFailed}});
  EXPECT_TRUE(a.load.empty());
  EXPECT_TRUE(a.unload.empty());
  EXPECT_TRUE(a.forget.empty()) << "the failed version was looked at: it stays listed with its reason";
}

TEST(SelectVersions, AFailedVersionWhoseFilesChangedIsTriedAgain) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {1, 2}, {{1, K::kReady}, {2, K::kFailedFilesChanged}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{2}));
}

TEST(SelectVersions, LatestTwoReachesPastAFailedVersion) {
  const VersionActions a = SelectVersions(Policy("latest:2"), {1, 2, 3}, {{3, K::kFailed}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{2, 1}));
}

TEST(SelectVersions, AnUnloadingVersionTheLatestPolicyWantsAgainIsLoadedAfresh) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {1}, {{1, K::kUnloading}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{1}));
  EXPECT_TRUE(a.unload.empty());
}

TEST(SelectVersions, AVersionRemovedFromTheStoreLeavesAndAFailedOneIsForgotten) {
  const VersionActions a = SelectVersions(Policy("latest:1"), {2}, {{1, K::kReady}, {2, K::kReady}, {3, K::kFailed}});
  EXPECT_TRUE(a.load.empty());
  EXPECT_EQ(a.unload, (std::vector<Unload>{{1, "removed from the store"}}));
  EXPECT_EQ(a.forget, (std::vector<int64_t>{3}));

  const VersionActions gone = SelectVersions(Policy("latest:1"), {}, {{2, K::kReady}});
  EXPECT_EQ(gone.unload, (std::vector<Unload>{{2, "removed from the store"}}));
}

TEST(SelectVersions, AFailedVersionOlderThanTheServingOneIsForgottenUnderLatest) {
  // latest:1 stops at the READY version 3; the failed 2 below it is no longer looked at.
  const VersionActions a = SelectVersions(Policy("latest:1"), {2, 3}, {{2, K::kFailed}, {3, K::kReady}});
  EXPECT_EQ(a.forget, (std::vector<int64_t>{2}));
  const VersionActions b = SelectVersions(Policy("latest:1"), {2, 3}, {{2, K::kFailedFilesChanged}, {3, K::kReady}});
  EXPECT_EQ(b.forget, (std::vector<int64_t>{2}));
  EXPECT_TRUE(b.load.empty());
}

TEST(SelectVersions, AllLoadsEveryVersionOnDisk) {
  const VersionActions a = SelectVersions(Policy("all"), {1, 2, 3}, {{2, K::kReady}, {3, K::kFailed}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{1}));
  EXPECT_TRUE(a.unload.empty());
  EXPECT_TRUE(a.forget.empty());
}

TEST(SelectVersions, SpecificServesExactlyItsVersions) {
  const VersionActions a =
      SelectVersions(Policy("specific:1,3"), {1, 2, 3, 4}, {{2, K::kReady}, {4, K::kReady}, {1, K::kReady}});
  EXPECT_EQ(a.load, (std::vector<int64_t>{3}));
  EXPECT_EQ(a.unload, (std::vector<Unload>{{2, "not selected by the version policy specific:1,3"},
                                           {4, "not selected by the version policy specific:1,3"}}));
}

TEST(SelectVersions, AShadowCandidateIsKeptBesideWhatThePolicyChoosesAmongTheOthers) {
  // latest:1 with version 3 the candidate: 2 serves (not replaced by 3), 3 is loaded beside it.
  const VersionActions a = SelectVersionsBeside(Policy("latest:1"), {1, 2, 3}, {{2, K::kReady}}, 3);
  EXPECT_EQ(a.load, (std::vector<int64_t>{3}));
  EXPECT_TRUE(a.unload.empty());
  const VersionActions b = SelectVersionsBeside(Policy("latest:1"), {1, 2, 3}, {{2, K::kReady}, {3, K::kReady}}, 3);
  EXPECT_TRUE(b.load.empty());
  EXPECT_TRUE(b.unload.empty());
  // A failed candidate is not retried until its files change; one not on disk is no candidate.
  EXPECT_TRUE(SelectVersionsBeside(Policy("latest:1"), {2, 3}, {{2, K::kReady}, {3, K::kFailed}}, 3).load.empty());
  const VersionActions gone = SelectVersionsBeside(Policy("latest:1"), {1, 2}, {{2, K::kReady}}, 3);
  EXPECT_TRUE(gone.load.empty() && gone.unload.empty());
  // Without a candidate, the policy alone: 3 replaces 2.
  const VersionActions none = SelectVersionsBeside(Policy("latest:1"), {2, 3}, {{2, K::kReady}, {3, K::kReady}}, 0);
  EXPECT_EQ(none.unload, (std::vector<Unload>{{2, "replaced by version 3 (version policy latest:1)"}}));
}

TEST(SelectVersions, ALatestPolicyWithNothingToServeTakesOutWhatTheNewPolicyDropped) {
  // Switching latest:2 → latest:1 with 1 and 2 READY: 1 leaves, replaced by the newest kept.
  const VersionActions a = SelectVersions(Policy("latest:1"), {1, 2}, {{1, K::kReady}, {2, K::kReady}});
  EXPECT_EQ(a.unload, (std::vector<Unload>{{1, "replaced by version 2 (version policy latest:1)"}}));
  // Nothing on disk is wanted (every version failed): what serves stays only if the policy keeps it.
  const VersionActions b = SelectVersions(Policy("specific:5"), {1, 5}, {{1, K::kReady}, {5, K::kFailed}});
  EXPECT_TRUE(b.load.empty());
  EXPECT_EQ(b.unload, (std::vector<Unload>{{1, "not selected by the version policy specific:5"}}));
}

}  // namespace
}  // namespace qvi
