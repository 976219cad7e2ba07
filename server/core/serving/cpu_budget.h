// How many CPUs the server may use, and how it spreads them over model instances and torch threads.
#ifndef QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_
#define QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "server/core/base/sync.h"

namespace qvi {

struct CpuBudget {
  int cpus = 1;     // whole CPUs this process may keep busy, at least 1
  std::string why;  // for the start-up log: "16 CPUs in the affinity mask, cgroup CPU limit 4.00"
};

// The CPUs this process may run on (sched_getaffinity: taskset, cpuset) capped by the CPU quota of
// its cgroup and the cgroups above it (a Kubernetes CPU limit, podman --cpus), rounded down.
// Counting the machine's cores instead would have a container limited to 2 CPUs on a 64-core node
// run 64 threads and be throttled. `cgroup_root` and `proc_self_cgroup` are the files to read
// (parameters for tests).
CpuBudget UsableCpus(const std::string& cgroup_root = "/sys/fs/cgroup",
                     const std::string& proc_self_cgroup = "/proc/self/cgroup");

// The CPUs a cgroup v2 cpu.max line allows ("400000 100000" -> 4.0); nullopt for "max ..." (no limit)
// or a line that is not a quota and a period.
std::optional<double> QuotaFromCpuMax(const std::string& cpu_max);

// How a CPU budget is spread over one model version's instances (threads each running one batch)
// and torch's intra-op threads (the threads inside one forward pass; one pool per instance, so
// instances x threads is what one model keeps busy). See PlanThreads in cpu_budget.cc for the
// measurements behind the rule.
struct ThreadPlan {
  int instances = 1;
  int torch_intra = 1;
};
ThreadPlan PlanThreads(int cpus, bool on_gpu);

// Whether the process has idle CPU for work that may wait (shadow mirrors, serving/shadow.h): its CPU time since
// the previous sample (at least `interval` before), as a share of the CPUs it may use, below `max_busy`. Sampled
// when asked, not on a timer: after a quiet spell the first sample averages over the spell (idle), so for one
// interval a burst's samples pass until the next sample sees it (Options::max_inflight_texts bounds them). On one core
// a batch cannot be pre-empted, so a caller's text that arrives while a mirrored batch runs waits for it whatever its
// priority; what keeps the callers' latency is running such work only while the CPU is mostly idle. Every thread counts
// (request threads, instances, the mirrored work itself, which so limits itself to about max_busy).
// Thread-safe; a sample (one clock_gettime) is taken at most once an interval, by the caller that finds it due.
class CpuHeadroom {
 public:
  struct Options {
    double max_busy = 0.5;  // --shadow-max-cpu-busy; 1 or more: never refuses
    int cpus = 1;           // UsableCpus
    absl::Duration interval = absl::Milliseconds(100);
  };
  using CpuTime = std::function<absl::Duration()>;  // the process's CPU time so far
  explicit CpuHeadroom(Options options, CpuTime cpu_time = ProcessCpuTime);

  // `now` on a monotonic clock (the core's). The first call measures nothing: busy() is 0 until the second
  // sample, an interval later.
  bool Idle(absl::Time now);
  // The share measured last (0 before the second sample).
  double busy() const;

  static absl::Duration ProcessCpuTime();

 private:
  const Options options_;
  const CpuTime cpu_time_;
  mutable Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time sampled_at_ ABSL_GUARDED_BY(mu_);
  absl::Duration cpu_at_ ABSL_GUARDED_BY(mu_);
  double busy_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_
