// How many CPUs the server may use, and how it spreads them over model instances and torch threads.
#ifndef QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_
#define QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_

#include <optional>
#include <string>
#include <string_view>

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

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_CPU_BUDGET_H_
