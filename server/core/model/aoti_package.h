// What an AOTInductor package (aoti_model.h) says of itself in extra/pt2.json, and whether it can run
// here: the device, CPU features and torch version it was compiled for.
#ifndef QVI_SERVER_CORE_MODEL_AOTI_PACKAGE_H_
#define QVI_SERVER_CORE_MODEL_AOTI_PACKAGE_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/model/viterbi.h"

namespace qvi {

// The package's own description, extra/pt2.json.
struct PackageInfo {
  std::string device;
  std::string cpu_target;
  std::string dtype = "float32";  // the package's arithmetic; it answers in float32 either way
  std::optional<bool> freezing;   // whether Inductor froze the weights (absent: an older exporter)
  std::string freezing_kept_by;   // "timing" when the exporter timed both and kept the faster
  std::string torch_version;
  std::vector<std::string> cpu_flags;  // /proc/cpuinfo flags the compiled code needs
  int64_t min_tokens = 2;
  int64_t max_batch = 1;
  std::map<std::string, std::vector<std::string>> outputs;  // method -> output names, in order
  std::optional<CrfScores> crf;
};

absl::StatusOr<PackageInfo> ParseInfo(const std::string& text, const std::string& path);

// The torch this server links ("2.11.0") and this machine's CPU flags (/proc/cpuinfo).
std::string TorchVersion();
const std::set<std::string>& CpuFlags();

// FAILED_PRECONDITION naming why a package compiled as `info` says cannot run on `device` here.
absl::Status CheckRunsHere(const PackageInfo& info, const std::string& path, const c10::Device& device);

// An exception's first line, for messages.
std::string FirstLine(const std::string& what);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_AOTI_PACKAGE_H_
