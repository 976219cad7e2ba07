#include "server/core/repository/memory_budget.h"

#include <ATen/DeviceAccelerator.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace qvi {
namespace {

constexpr std::pair<const char*, double> kUnits[] = {{"kib", 1024.0},
                                                     {"mib", 1024.0 * 1024},
                                                     {"gib", 1024.0 * 1024 * 1024},
                                                     {"tib", 1024.0 * 1024 * 1024 * 1024},
                                                     {"kb", 1e3},
                                                     {"mb", 1e6},
                                                     {"gb", 1e9},
                                                     {"tb", 1e12},
                                                     {"b", 1.0}};

absl::Status Invalid(const std::string& text, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--device-memory-budget '", text.substr(0, 64), "': ", why,
      "; give bytes (24GiB, 512MB, 1073741824), a fraction of each device's memory (0.8) or a percentage (80%)"));
}

// The resident set of this process, from /proc/self/statm (its second field, in pages).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// The cgroup v2 memory limit ("max": none), 0 when there is none or it cannot be read.
int64_t CgroupLimitBytes() {
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::string text;
  if (!(limit >> text)) return 0;
  int64_t bytes = 0;
  return absl::SimpleAtoi(text, &bytes) && bytes > 0 ? bytes : 0;
}

class SystemMeter final : public MemoryMeter {
 public:
  int64_t InUse(const c10::Device& device) const override {
    if (!device.is_cuda()) return ResidentBytes();
    const c10::CachingDeviceAllocator::DeviceStats stats = at::accelerator::getDeviceStats(device.index());
    return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
  int64_t Capacity(const c10::Device& device) const override {
    if (device.is_cuda()) return static_cast<int64_t>(at::accelerator::getMemoryInfo(device.index()).second);
    const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    const int64_t cgroup = CgroupLimitBytes();
    return cgroup > 0 ? std::min(physical, cgroup) : physical;
  }
};

}  // namespace

int64_t MemoryBudget::On(int64_t capacity) const {
  if (bytes > 0) return bytes;
  return static_cast<int64_t>(fraction * static_cast<double>(capacity));
}

std::string MemoryBudget::ToString() const {
  if (bytes > 0) return FormatBytes(bytes);
  if (fraction > 0) return absl::StrCat(absl::StrFormat("%g", fraction * 100), "% of each device's memory");
  return "none";
}

absl::StatusOr<MemoryBudget> ParseMemoryBudget(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  MemoryBudget budget;
  if (lower.empty() || lower == "0") return budget;
  absl::string_view number = lower;
  if (absl::ConsumeSuffix(&number, "%")) {
    double percent = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &percent) || !(percent > 0 && percent <= 100)) {
      return Invalid(text, "a percentage is above 0 and at most 100");
    }
    budget.fraction = percent / 100;
    return budget;
  }
  double scale = 0;
  for (const auto& [unit, factor] : kUnits) {
    if (absl::ConsumeSuffix(&number, unit)) {
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &value) || !std::isfinite(value) || value <= 0) {
    return Invalid(text, "not a positive number of bytes or fraction");
  }
  if (scale == 0 && value <= 1 && absl::StrContains(number, '.')) {
    budget.fraction = value;  // "0.8", "1.0": a fraction of the device
    return budget;
  }
  const double bytes = value * (scale == 0 ? 1.0 : scale);
  if (bytes < 1024 * 1024) return Invalid(text, "less than 1 MiB, too little for any model");
  if (bytes > static_cast<double>(std::numeric_limits<int64_t>::max() / 2)) return Invalid(text, "too large");
  budget.bytes = static_cast<int64_t>(bytes);
  return budget;
}

std::string FormatBytes(int64_t bytes) {
  constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kNames[unit]);
}

const MemoryMeter& SystemMemoryMeter() {
  static const SystemMeter meter;
  return meter;
}

}  // namespace qvi
