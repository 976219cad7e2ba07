// --device-memory-budget: how much memory the loaded model versions may take on each device, and
// how a version's share is measured.
//
// A budget is bytes ("24GiB", "512MB", "1073741824") or a fraction of each device's memory ("0.8",
// "80%"): of a GPU's total memory, of the CPU's physical memory or the cgroup's limit, whichever is
// smaller (a container's limit is what the kernel enforces). The same budget applies to every device.
//
// A version's footprint is measured at its load (ModelRepository): the memory in use on its device
// after the load (weights, CUDA graphs, the warm-up's workspace) less what was in use before. On a
// GPU that is the caching allocator's reserved bytes, which only this process's tensors move; on the
// CPU it is the process's resident set, which everything the process does moves, so it is
// approximate there. A model's serving.json may state its footprint (`memory_bytes`) instead.
#ifndef QVI_SERVER_CORE_REPOSITORY_MEMORY_BUDGET_H_
#define QVI_SERVER_CORE_REPOSITORY_MEMORY_BUDGET_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace qvi {

struct MemoryBudget {
  int64_t bytes = 0;    // the budget in bytes, when given so
  double fraction = 0;  // else a fraction of each device's memory, in (0, 1]
  bool enabled() const { return bytes > 0 || fraction > 0; }
  // The budget on a device with `capacity` bytes of memory.
  int64_t On(int64_t capacity) const;
  std::string ToString() const;  // "24 GiB", "80% of each device"
};

// "" or "0": no budget. Bytes with an optional unit (B, KB, MB, GB, TB: powers of 1000; KiB, MiB,
// GiB, TiB: of 1024), a fraction ("0.8") or a percentage ("80%"). The error names the flag.
absl::StatusOr<MemoryBudget> ParseMemoryBudget(const std::string& text);

// "12.3 MiB": for messages and logs.
std::string FormatBytes(int64_t bytes);

// Memory in use on a device, and its size, as the budget counts them.
class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  // A GPU: the bytes its caching allocator has reserved; the CPU: this process's resident set.
  virtual int64_t InUse(const c10::Device& device) const = 0;
  // A GPU: its total memory; the CPU: physical memory, or the cgroup's memory limit when lower.
  virtual int64_t Capacity(const c10::Device& device) const = 0;
};

// The meter of this process and its devices (torch's accelerator API for GPUs, /proc and /sys for the CPU).
const MemoryMeter& SystemMemoryMeter();

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_MEMORY_BUDGET_H_
