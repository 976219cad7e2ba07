#include "server/core/serving/cpu_budget.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace qvi {
namespace {

namespace fs = std::filesystem;

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

// A fake /sys/fs/cgroup and /proc/self/cgroup in a temporary folder.
class FakeCgroups {
 public:
  FakeCgroups() {
    std::mt19937_64 rng(std::random_device{}());
    root_ = fs::temp_directory_path() / ("qvi_cgroup_" + std::to_string(rng()));
    fs::create_directories(root_);
  }
  ~FakeCgroups() { fs::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  CpuBudget Read() const { return UsableCpus((root_ / "sys").string(), (root_ / "proc_self_cgroup").string()); }

 private:
  fs::path root_;
};

TEST(CpuBudgetTest, CpuMaxGivesTheQuotaInCpus) {
  EXPECT_EQ(QuotaFromCpuMax("400000 100000"), 4.0);
  EXPECT_EQ(QuotaFromCpuMax("150000 100000"), 1.5);
  EXPECT_EQ(QuotaFromCpuMax("max 100000"), std::nullopt);
  EXPECT_EQ(QuotaFromCpuMax(""), std::nullopt);
  EXPECT_EQ(QuotaFromCpuMax("abc 100000"), std::nullopt);
  EXPECT_EQ(QuotaFromCpuMax("100000 0"), std::nullopt);
  EXPECT_EQ(QuotaFromCpuMax("100000 100000 7"), std::nullopt);
}

TEST(CpuBudgetTest, WithoutALimitTheAffinityMaskCounts) {
  FakeCgroups c;
  c.Write("proc_self_cgroup", "0::/");
  c.Write("sys/cpu.max", "max 100000");
  const CpuBudget b = c.Read();
  EXPECT_EQ(b.cpus, AffinityCpus());
  EXPECT_NE(b.why.find("no cgroup CPU limit"), std::string::npos) << b.why;
}

TEST(CpuBudgetTest, ACgroupV2LimitOnTheProcessOrAParentCapsTheCpusRoundedDown) {
  FakeCgroups c;
  c.Write("proc_self_cgroup", "0::/kubepods/pod1/c1");
  c.Write("sys/kubepods/pod1/c1/cpu.max", "max 100000");
  c.Write("sys/kubepods/pod1/cpu.max", "150000 100000");  // the pod's limit: 1.5 CPUs
  c.Write("sys/kubepods/cpu.max", "max 100000");
  const CpuBudget b = c.Read();
  EXPECT_EQ(b.cpus, 1);
  EXPECT_NE(b.why.find("cgroup CPU limit 1.50"), std::string::npos) << b.why;
}

TEST(CpuBudgetTest, ALimitAboveTheAffinityMaskChangesNothing) {
  FakeCgroups c;
  c.Write("proc_self_cgroup", "0::/");
  c.Write("sys/cpu.max", "100000000 100000");  // 1000 CPUs
  EXPECT_EQ(c.Read().cpus, AffinityCpus());
}

TEST(CpuBudgetTest, ACgroupV1QuotaCountsAndMinusOneMeansNone) {
  FakeCgroups c;
  c.Write("proc_self_cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/");
  c.Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1");
  c.Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  EXPECT_EQ(c.Read().cpus, AffinityCpus());
  c.Write("sys/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "100000");
  EXPECT_EQ(c.Read().cpus, 1);
}

TEST(CpuBudgetTest, MissingOrGarbledFilesFallBackToTheAffinityMask) {
  FakeCgroups c;  // no files at all
  EXPECT_EQ(c.Read().cpus, AffinityCpus());
  c.Write("proc_self_cgroup", "garbage\n0::/\n");
  c.Write("sys/cpu.max", "lots of CPUs");
  EXPECT_EQ(c.Read().cpus, AffinityCpus());
}

TEST(CpuBudgetTest, OnTheCpuEachCpuGetsAnInstanceUpToEightThenThreads) {
  EXPECT_EQ(PlanThreads(1, false).instances, 1);
  EXPECT_EQ(PlanThreads(1, false).torch_intra, 1);
  EXPECT_EQ(PlanThreads(2, false).instances, 2);
  EXPECT_EQ(PlanThreads(2, false).torch_intra, 1);
  EXPECT_EQ(PlanThreads(8, false).instances, 8);
  EXPECT_EQ(PlanThreads(8, false).torch_intra, 1);
  EXPECT_EQ(PlanThreads(16, false).instances, 8);
  EXPECT_EQ(PlanThreads(16, false).torch_intra, 2);
  EXPECT_EQ(PlanThreads(20, false).torch_intra, 2);  // never more threads than CPUs
  EXPECT_EQ(PlanThreads(0, false).instances, 1);
}

TEST(CpuBudgetTest, OnAGpuOneInstanceFeedsTheDevice) {
  EXPECT_EQ(PlanThreads(16, true).instances, 1);
  EXPECT_EQ(PlanThreads(16, true).torch_intra, 1);
}

// The headroom's arithmetic on a fake clock and a fake CPU time: the share of the CPUs the process used over the
// last interval, sampled at most once an interval.
TEST(CpuHeadroomTest, MeasuresTheLastIntervalsShareOfTheCpus) {
  absl::Duration cpu = absl::ZeroDuration();
  int samples = 0;
  CpuHeadroom h({.max_busy = 0.5, .cpus = 2, .interval = absl::Milliseconds(100)}, [&] {
    ++samples;
    return cpu;
  });
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(h.Idle(t0));  // nothing measured yet
  EXPECT_EQ(samples, 1);
  cpu += absl::Milliseconds(150);  // 150 ms of CPU in 100 ms on 2 CPUs: 75 % busy
  EXPECT_TRUE(h.Idle(t0 + absl::Milliseconds(50))) << "sampled before its interval";
  EXPECT_EQ(samples, 1);
  EXPECT_FALSE(h.Idle(t0 + absl::Milliseconds(100)));
  EXPECT_DOUBLE_EQ(h.busy(), 0.75);
  EXPECT_EQ(samples, 2);
  cpu += absl::Milliseconds(50);  // 50 ms in the next 200 ms: 12.5 %
  EXPECT_FALSE(h.Idle(t0 + absl::Milliseconds(150))) << "the last measure holds until the next sample";
  EXPECT_TRUE(h.Idle(t0 + absl::Milliseconds(300)));
  EXPECT_DOUBLE_EQ(h.busy(), 0.125);
  EXPECT_EQ(samples, 3);
  EXPECT_TRUE(h.Idle(t0 + absl::Milliseconds(250))) << "a clock that went back: the last measure";
  EXPECT_EQ(samples, 4) << "and a new baseline";
  cpu += absl::Milliseconds(200);  // 200 ms in the 100 ms since that baseline: 100 %
  EXPECT_FALSE(h.Idle(t0 + absl::Milliseconds(350)));
  EXPECT_DOUBLE_EQ(h.busy(), 1.0);
}

TEST(CpuHeadroomTest, AtOneItNeverRefusesAtZeroAlways) {
  absl::Duration cpu = absl::ZeroDuration();
  CpuHeadroom always({.max_busy = 1.0, .cpus = 1}, [&] { return cpu; });
  CpuHeadroom never({.max_busy = 0.0, .cpus = 1}, [&] { return cpu; });
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  cpu += absl::Seconds(10);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(always.Idle(t0 + absl::Seconds(i)));
    EXPECT_FALSE(never.Idle(t0 + absl::Seconds(i)));
  }
  EXPECT_GT(CpuHeadroom::ProcessCpuTime(), absl::ZeroDuration());  // this test's own CPU time so far
}

}  // namespace
}  // namespace qvi
