#include "server/core/model/aoti_package.h"

#include <torch/headeronly/version.h>

#include <exception>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace qvi {
namespace {

using json = nlohmann::json;

// 2: the CPU kernels take their OpenMP team size at run time (1 had the exporting machine's core count
// compiled in, ignoring --torch-intra-op-threads).
constexpr int kInfoVersion = 2;

}  // namespace

std::string FirstLine(const std::string& what) { return what.substr(0, what.find('\n')); }

std::string TorchVersion() {
  return absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

absl::StatusOr<PackageInfo> ParseInfo(const std::string& text, const std::string& path) {
  PackageInfo info;
  try {
    const json j = json::parse(text);
    if (j.at("info_version").get<int>() != kInfoVersion) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": pt2.json info_version ", j.at("info_version").dump(),
                                                     " is not ", kInfoVersion, " (written by another exporter)"));
    }
    info.device = j.at("device").get<std::string>();
    info.cpu_target = j.value("cpu_target", "");
    info.dtype = j.value("dtype", "float32");
    if (j.contains("freezing")) info.freezing = j["freezing"].get<bool>();
    if (j.contains("freezing_choice")) info.freezing_kept_by = "timing";
    info.torch_version = j.at("torch_version").get<std::string>();
    info.cpu_flags = j.value("cpu_flags", std::vector<std::string>{});
    info.min_tokens = j.at("min_tokens").get<int64_t>();
    info.max_batch = j.at("max_batch").get<int64_t>();
    info.outputs = j.at("outputs").get<std::map<std::string, std::vector<std::string>>>();
    if (j.contains("crf")) {
      const json& c = j["crf"];
      CrfScores crf{c.at("start").get<std::vector<float>>(), c.at("end").get<std::vector<float>>(), {}};
      for (const auto& row : c.at("transitions")) {
        for (float v : row.get<std::vector<float>>()) crf.transitions.push_back(v);
      }
      if (crf.end.size() != crf.start.size() || crf.transitions.size() != crf.start.size() * crf.start.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": pt2.json crf scores do not form a ", crf.start.size(), "-tag CRF"));
      }
      info.crf = std::move(crf);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": pt2.json is not valid: ", FirstLine(e.what())));
  }
  if (info.min_tokens < 1 || info.max_batch < 1 || !info.outputs.count("model")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": pt2.json needs min_tokens >= 1, max_batch >= 1 and the outputs of 'model'"));
  }
  return info;
}

const std::set<std::string>& CpuFlags() {
  static const std::set<std::string> flags = [] {
    std::set<std::string> out;
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("flags", 0) != 0) continue;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      for (absl::string_view f : absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty())) out.emplace(f);
      break;
    }
    return out;
  }();
  return flags;
}

// Checked before any compiled code is loaded: code for another device, CPU or torch must not run.
absl::Status CheckRunsHere(const PackageInfo& info, const std::string& path, const c10::Device& device) {
  if (info.device != (device.is_cuda() ? "cuda" : "cpu")) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " was compiled for ", info.device, " but this version is served on ", device.str()));
  }
  if (info.torch_version != TorchVersion()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " was compiled by torch ", info.torch_version,
                                                      " but this server runs LibTorch ", TorchVersion(),
                                                      "; compile it again with this torch"));
  }
  std::vector<std::string> missing;
  for (const std::string& flag : info.cpu_flags) {
    if (!CpuFlags().count(flag)) missing.push_back(flag);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path, " was compiled for CPU target '", info.cpu_target,
                   "', which needs CPU features this machine lacks: ", absl::StrJoin(missing, ", ")));
}

}  // namespace qvi
