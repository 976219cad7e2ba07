#include "server/core/serving/cpu_budget.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace qvi {
namespace {

std::optional<std::string> ReadFirstLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<double> ParseDouble(const std::string& s) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v)) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// cgroup v1: quota and period in microseconds, the quota -1 when there is none.
std::optional<double> QuotaFromCfs(const std::filesystem::path& dir) {
  const auto quota = ReadFirstLine(dir / "cpu.cfs_quota_us");
  const auto period = ReadFirstLine(dir / "cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  const auto q = ParseDouble(*quota);
  const auto p = ParseDouble(*period);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return *q / *p;
}

// The tightest quota on the way from `leaf` up to `root` (a limit on a parent binds its children).
std::optional<double> TightestQuota(const std::filesystem::path& root, const std::string& cgroup_path, bool v2) {
  std::optional<double> best;
  std::filesystem::path dir = root / std::filesystem::path(cgroup_path).relative_path();
  while (true) {
    std::optional<double> q;
    if (v2) {
      if (auto line = ReadFirstLine(dir / "cpu.max")) q = QuotaFromCpuMax(*line);
    } else {
      q = QuotaFromCfs(dir);
    }
    if (q && (!best || *q < *best)) best = q;
    if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < root.string().size()) break;
  }
  return best;
}

}  // namespace

std::optional<double> QuotaFromCpuMax(const std::string& cpu_max) {
  std::vector<std::string> parts = absl::StrSplit(cpu_max, ' ', absl::SkipEmpty());
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  const auto quota = ParseDouble(parts[0]);
  const auto period = ParseDouble(parts[1]);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return *quota / *period;
}

CpuBudget UsableCpus(const std::string& cgroup_root, const std::string& proc_self_cgroup) {
  int affinity = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) affinity = CPU_COUNT(&set);
  if (affinity <= 0) affinity = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // /proc/self/cgroup: "0::/path" for cgroup v2, "N:cpu,cpuacct:/path" for v1's CPU controller.
  std::optional<double> quota;
  std::ifstream cgroups(proc_self_cgroup);
  const std::filesystem::path root(cgroup_root);
  for (std::string line; std::getline(cgroups, line);) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    std::optional<double> q;
    if (f[0] == "0" && f[1].empty()) {
      // v2, unified at the root, or (hybrid hierarchy) under unified/.
      q = TightestQuota(root, f[2], true);
      if (!q) q = TightestQuota(root / "unified", f[2], true);
    } else {
      std::vector<std::string> controllers = absl::StrSplit(f[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "cpu") == controllers.end()) continue;
      // v1 mounts the controller as cpu/, cpu,cpuacct/ or cpuacct,cpu/; inside a container the
      // path shown is often the host's while the mount is the container's own, so try "/" too.
      for (const std::string& mount : {f[1], std::string("cpu"), std::string("cpu,cpuacct")}) {
        for (const std::string& path : {f[2], std::string("/")}) {
          if (!q) q = TightestQuota(root / mount, path, false);
        }
      }
    }
    if (q && (!quota || *q < *quota)) quota = q;
  }

  CpuBudget b;
  b.cpus = affinity;
  b.why = absl::StrCat(affinity, " CPU(s) in the affinity mask");
  if (quota) {
    b.cpus = std::clamp(static_cast<int>(std::floor(*quota)), 1, affinity);
    absl::StrAppend(&b.why, absl::StrFormat(", cgroup CPU limit %.2f", *quota));
  } else {
    absl::StrAppend(&b.why, ", no cgroup CPU limit");
  }
  return b;
}

// On the CPU, one instance per CPU with one torch thread each, up to kMaxCpuInstances instances;
// CPUs beyond that go to torch threads. Measured on 2 CPUs (docs/performance.md, "Instances and
// torch threads"), the demo classifier through the server at 16 calls in flight: 2 instances x 1
// thread made 4,841 short (20-word) and 1,436 long (100-word) texts/s, against 4,630 and 1,049 for
// 1 x 1 and 3,187 and 1,230 for 1 x 2. Small batches on their own cores beat one batch split
// across cores: a forward of these models is too short for intra-op threads to pay for their
// hand-offs, except a single long text at one call in flight (1 x 2 was 12% faster there).
// The cap, and what larger machines get, is not measured here: past 8 instances the batches each
// forms get small and every instance holds its own runner, so the rest goes into each forward.
// On a GPU one instance: with batches pipelined (ModelRunner) one instance thread keeps a device busy
// with full batches, and more instances only split them. On the emulated device (docs/performance.md,
// "How many instances on a device"), one text per request at 1,024 in flight, one pipelined instance
// served 35.4k texts/s where the device was the bottleneck, against 32.9k for two and 26.6k for four
// (smaller batches, each paying the per-batch time) and 32.7k for four without the pipeline (today's
// four-instance GPU figures); where the CPUs were, one served the most too. Not yet measured on a GPU.
constexpr int kMaxCpuInstances = 8;

ThreadPlan PlanThreads(int cpus, bool on_gpu) {
  ThreadPlan p;
  if (on_gpu) return p;
  cpus = std::max(cpus, 1);
  p.instances = std::min(cpus, kMaxCpuInstances);
  p.torch_intra = std::max(1, cpus / p.instances);
  return p;
}

CpuHeadroom::CpuHeadroom(Options options, CpuTime cpu_time) : options_(options), cpu_time_(std::move(cpu_time)) {}

bool CpuHeadroom::Idle(absl::Time now) {
  if (options_.max_busy >= 1) return true;
  MutexLock lock(&mu_);
  // A clock that went back starts a new baseline (the last measure holds until the next sample).
  if (!started_ || now < sampled_at_ || now - sampled_at_ >= options_.interval) {
    const absl::Duration cpu = cpu_time_();
    if (started_ && now > sampled_at_) {
      busy_ = absl::FDivDuration(cpu - cpu_at_, now - sampled_at_) / std::max(options_.cpus, 1);
    }
    started_ = true;
    sampled_at_ = now;
    cpu_at_ = cpu;
  }
  return busy_ < options_.max_busy;
}

double CpuHeadroom::busy() const {
  MutexLock lock(&mu_);
  return busy_;
}

absl::Duration CpuHeadroom::ProcessCpuTime() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return absl::ZeroDuration();
  return absl::DurationFromTimespec(ts);
}

}  // namespace qvi
