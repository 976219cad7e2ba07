#include "server/core/model.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <link.h>
#include <torch/cuda.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/aoti_model.h"
#include "server/core/torchscript_model.h"

namespace qvi {
namespace {

// A model file is untrusted input too: its outputs must have the shapes its manifest promises
// before post-processing indexes into them.
absl::Status CheckOutputs(const Manifest& m, const std::map<std::string, torch::Tensor>& out, int64_t batch,
                          int64_t width) {
  auto bad = [&](const std::string& name, const torch::Tensor& t, const std::string& want) {
    std::string got;
    for (int64_t d : t.sizes()) got += (got.empty() ? "" : ",") + std::to_string(d);
    return absl::InternalError(absl::StrCat("model '", m.name, "' returned ", name, " of shape [", got, "] and type ",
                                            std::string(c10::toString(t.scalar_type())), "; expected ", want));
  };
  for (const auto& [name, t] : out) {
    const bool per_token = t.dim() >= 2 && t.size(0) == batch && t.size(-1) == width;
    if (name == "logits") {
      if (t.dim() != 2 || t.size(0) != batch || t.size(1) != static_cast<int64_t>(m.labels.size()) ||
          !t.is_floating_point()) {
        return bad(name, t, absl::StrCat("float [", batch, ",", m.labels.size(), "]"));
      }
    } else if (name == "tags") {
      if (t.dim() != 2 || !per_token || t.scalar_type() != torch::kLong)
        return bad(name, t, absl::StrCat("int64 [", batch, ",", width, "]"));
    } else if (name == "emissions") {
      if (t.dim() != 3 || t.size(0) != batch || t.size(1) != width ||
          t.size(2) != static_cast<int64_t>(m.tags.size()) || !t.is_floating_point()) {
        return bad(name, t, absl::StrCat("float [", batch, ",", width, ",", m.tags.size(), "]"));
      }
    } else if (name == "layer_attention") {
      if (t.dim() != 5 || t.size(0) != batch || t.size(3) != width || t.size(4) != width || !t.is_floating_point()) {
        return bad(name, t, "float [B,L,H,T,T]");
      }
    } else if (name.rfind("layer_", 0) == 0) {
      if (t.dim() != 4 || !per_token || !t.is_floating_point()) return bad(name, t, "float [B,L,H,T]");
    } else if (t.dim() != 2 || !per_token || !t.is_floating_point()) {
      return bad(name, t, absl::StrCat("float [", batch, ",", width, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<torch::Device> ResolveDevice(const std::string& spec) {
  if (spec == "auto") {
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  }
  if (spec == "cpu") return torch::Device(torch::kCPU);
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
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(absl::StrCat("device '", spec, "' is not auto, cpu, cuda or cuda:N"));
}

DeviceStreamScope::DeviceStreamScope(torch::Device device) {
  if (device.is_cuda()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    guard_ = std::make_unique<c10::StreamGuard>(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false));
  }
}

DeviceStreamScope::~DeviceStreamScope() = default;

std::string Pt2FileName(const torch::Device& device) { return device.is_cuda() ? "model.cuda.pt2" : "model.cpu.pt2"; }

std::vector<std::string> ModelFileNames() { return {kTorchScriptFile, "model.cpu.pt2", "model.cuda.pt2"}; }

absl::StatusOr<std::pair<Manifest, Vocabulary>> ParseArtifactFiles(const std::string& manifest_json,
                                                                   const std::string& vocab_txt,
                                                                   const std::string& where) {
  if (manifest_json.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no manifest.json"));
  absl::StatusOr<Manifest> manifest = Manifest::Parse(manifest_json);
  if (!manifest.ok()) return manifest.status();
  absl::StatusOr<Vocabulary> vocab = Vocabulary::Parse(vocab_txt);
  if (!vocab.ok()) return vocab.status();
  if (static_cast<int>(vocab->size()) != manifest->vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab.txt has ", vocab->size(), " tokens but manifest.json says ", manifest->vocab_size));
  }
  return std::make_pair(*std::move(manifest), *std::move(vocab));
}

Model::Model(Manifest manifest, Vocabulary vocabulary, torch::Device device, std::string file)
    : manifest_(std::make_shared<const Manifest>(std::move(manifest))),
      vocabulary_(std::move(vocabulary)),
      tokenizer_(manifest_->tokenizer),
      device_(device),
      file_(std::move(file)) {}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const LoadOptions& options) {
  if (absl::Status s = CheckModelFormat(options.format); !s.ok()) return s;
  absl::StatusOr<torch::Device> device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  const std::filesystem::path folder(dir);
  const std::string script = (folder / kTorchScriptFile).string();
  const std::string package = (folder / Pt2FileName(*device)).string();
  std::error_code ec;
  const bool have_script = std::filesystem::exists(script, ec);
  const bool have_package = std::filesystem::exists(package, ec);
  if (options.format == "torchscript" || (options.format == "auto" && !have_package)) {
    if (!have_script) {
      return absl::NotFoundError(
          options.format == "auto" ? absl::StrCat(dir, " has neither ", kTorchScriptFile, " nor ", Pt2FileName(*device))
                                   : absl::StrCat(script, " does not exist (format torchscript)"));
    }
    return LoadTorchScript(script, *device);
  }
  if (!have_package) return absl::NotFoundError(absl::StrCat(package, " does not exist (format pt2)"));
  absl::StatusOr<std::unique_ptr<Model>> compiled = LoadAotInductor(package, *device, options.instances);
  if (compiled.ok() || options.format == "pt2" || !have_script) return compiled;
  // "auto": a package that cannot run here (another device, CPU or torch) leaves the TorchScript
  // file to serve; the reason stays visible in the log and in GetModel.
  absl::StatusOr<std::unique_ptr<Model>> script_model = LoadTorchScript(script, *device);
  if (!script_model.ok()) {
    return absl::Status(script_model.status().code(),
                        absl::StrCat(script_model.status().message(), "; and ", Pt2FileName(*device),
                                     " did not load either: ", compiled.status().message()));
  }
  (*script_model)->fallback_reason_ = absl::StrCat(Pt2FileName(*device), " not used: ", compiled.status().message());
  return script_model;
}

absl::Status Model::WarmUp() {
  torch::Tensor ids = torch::full({2, 4}, Vocabulary::kUnkId, torch::kLong);
  torch::Tensor mask = torch::ones({2, 4}, torch::kBool);
  mask.index_put_({1, torch::indexing::Slice(2)}, false);
  std::vector<std::string> all, lean_wanted;
  for (const auto& [name, _] : manifest_->outputs) {
    all.push_back(name);
    if (name != "layer_attention") lean_wanted.push_back(name);
  }
  std::set<std::string> full, lean;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::map<std::string, torch::Tensor>> out = Forward(ids, mask, all);
    if (!out.ok()) return absl::InvalidArgumentError(absl::StrCat("warm-up failed: ", out.status().message()));
    full.clear();
    for (const auto& [name, _] : *out) full.insert(name);
  }
  if (!has_forward_without_maps()) return absl::OkStatus();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::map<std::string, torch::Tensor>> out = Forward(ids, mask, lean_wanted);
    if (!out.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("warm-up of the forward without maps failed: ", out.status().message()));
    }
    lean.clear();
    for (const auto& [name, _] : *out) lean.insert(name);
  }
  full.erase("layer_attention");
  if (full != lean) {
    return absl::InvalidArgumentError(absl::StrCat("the forward without maps returns [", absl::StrJoin(lean, ","),
                                                   "] but forward returns [", absl::StrJoin(full, ","),
                                                   "] besides layer_attention; they must agree"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, torch::Tensor>> Model::Forward(const torch::Tensor& ids, const torch::Tensor& mask,
                                                                    const std::vector<std::string>& wanted,
                                                                    const OutputSelection& selection) const {
  std::map<std::string, torch::Tensor> out;
  try {
    c10::InferenceMode guard;
    const bool cuda = device_.is_cuda();
    const bool maps_wanted = std::find(wanted.begin(), wanted.end(), "layer_attention") != wanted.end();
    std::map<std::string, torch::Tensor> result = Run(
        cuda ? ids.pin_memory().to(device_, /*non_blocking=*/true) : ids,
        cuda ? mask.pin_memory().to(device_, /*non_blocking=*/true) : mask, maps_wanted || !has_forward_without_maps());
    for (const std::string& name : wanted) {
      auto it = result.find(name);
      if (it != result.end()) out[name] = std::move(it->second);
    }
    if (absl::Status s = CheckOutputs(*manifest_, out, ids.size(0), ids.size(1)); !s.ok()) return s;
    // Only the selected layers and heads of the per-layer outputs are copied off the device.
    torch::Tensor layer_index, head_index;
    for (auto& [name, t] : out) {
      if (name.rfind("layer_", 0) == 0) {
        if (!selection.layers.empty()) {
          if (selection.layers.back() >= t.size(1)) return absl::InternalError("layer selection out of range");
          layer_index = torch::tensor(selection.layers, torch::kLong);
          t = t.index_select(1, layer_index.to(t.device()));
        }
        if (!selection.heads.empty()) {
          if (selection.heads.back() >= t.size(2)) return absl::InternalError("head selection out of range");
          head_index = torch::tensor(selection.heads, torch::kLong);
          t = t.index_select(2, head_index.to(t.device()));
        }
        if (selection.mean_heads) {
          t = t.mean(2, /*keepdim=*/true);
          head_index = torch::tensor(std::vector<int64_t>{-1}, torch::kLong);
        }
      }
      t = t.to(torch::kCPU);
      // A half-precision model (bf16, fp16) answers in float32 like any other: converted after the
      // copy, which then moves half the bytes.
      if (t.is_floating_point() && t.scalar_type() != torch::kFloat) t = t.to(torch::kFloat);
    }
    if (layer_index.defined()) out["layer_index"] = layer_index;
    if (head_index.defined()) out["head_index"] = head_index;
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InternalError(absl::StrCat("model failed: ", what.substr(0, what.find('\n'))));
  }
  return out;
}

}  // namespace qvi
