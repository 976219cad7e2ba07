#include "server/core/model/cuda_support.h"

#include <c10/core/Device.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <link.h>
#include <torch/cuda.h>

#include <exception>
#include <filesystem>
#include <stdexcept>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/model/graphs.h"

namespace qvi {

std::string TorchLibraryDir() {
  void* cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  struct link_map* map = nullptr;
  if (cpu == nullptr || dlinfo(cpu, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return "";
  std::string dir = std::filesystem::path(map->l_name).parent_path().string();
  dlclose(cpu);
  return dir;
}

std::string LoadCudaSupport() {
  const std::string dir = TorchLibraryDir();
  if (dir.empty()) return "CUDA: off (cannot locate libtorch_cpu.so in this process)";
  const std::filesystem::path cuda = std::filesystem::path(dir) / "libtorch_cuda.so";
  std::error_code ec;
  if (!std::filesystem::exists(cuda, ec)) return "CUDA: off (this LibTorch is CPU-only: no libtorch_cuda.so)";
  if (dlopen(cuda.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* error = dlerror();
    return absl::StrCat("CUDA: off (cannot load ", cuda.string(), ": ", error != nullptr ? error : "unknown error",
                        ")");
  }
  const size_t devices = torch::cuda::device_count();
  return absl::StrCat("CUDA: backend loaded, ", devices, " device(s) visible");
}

absl::StatusOr<GraphBackend*> LoadCudaGraphBackend() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot locate this executable: ", ec.message()));
  const std::filesystem::path plugin = exe.parent_path() / kGraphPluginFile;
  if (!std::filesystem::exists(plugin, ec)) {
    return absl::UnavailableError(absl::StrCat("no ", kGraphPluginFile, " beside ", exe.string(),
                                               " (built only where the CUDA headers are found: see CMakeLists.txt)"));
  }
  absl::StatusOr<GraphBackend*> backend = LoadGraphPlugin(plugin.string());
  if (backend.ok() && !torch::cuda::is_available()) {
    return absl::UnavailableError(absl::StrCat(kGraphPluginFile, " loaded, but this process has no CUDA device"));
  }
  return backend;
}

absl::StatusOr<GraphBackend*> LoadGraphPlugin(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::UnavailableError(absl::StrCat("cannot load ", path, ": ", error != nullptr ? error : "unknown error"));
  }
  auto entry = reinterpret_cast<GraphBackend* (*)()>(dlsym(handle, kGraphBackendSymbol));
  if (entry == nullptr) return absl::UnavailableError(absl::StrCat(path, " has no ", kGraphBackendSymbol));
  return entry();  // the plugin stays loaded for the life of the process
}

absl::StatusOr<c10::Device> ResolveDevice(const std::string& spec) {
  if (spec == "auto") {
    return torch::cuda::is_available() ? c10::Device(at::kCUDA, 0) : c10::Device(at::kCPU);
  }
  if (spec == "cpu") return c10::Device(at::kCPU);
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (spec.size() > 5) {
      try {
        size_t used = 0;
        index = std::stoi(spec.substr(5), &used);
        if (used != spec.size() - 5 || index < 0) throw std::invalid_argument(spec);
      } catch (const std::exception&) {
        return absl::InvalidArgumentError(absl::StrCat("device '", spec, "' is not auto, cpu, cuda or cuda:N"));
      }
    }
    const int count = static_cast<int>(torch::cuda::device_count());
    if (index >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("device '", spec, "' was asked for but this machine has ", count, " CUDA device(s)"));
    }
    return c10::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(absl::StrCat("device '", spec, "' is not auto, cpu, cuda or cuda:N"));
}

DeviceStreamScope::DeviceStreamScope(c10::Device device) {
  if (device.is_cuda()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    guard_ = std::make_unique<c10::StreamGuard>(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false));
  }
}

DeviceStreamScope::~DeviceStreamScope() = default;

}  // namespace qvi
