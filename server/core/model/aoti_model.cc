#include "server/core/model/aoti_model.h"

#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "server/core/model/aoti_package.h"
#include "server/core/model/viterbi.h"

namespace qvi {
namespace {

using json = nlohmann::json;
using torch::inductor::AOTIModelPackageLoader;

// The output names of a package model, in the order its runner returns them: the keys of the dict
// in its call spec's output tree ([version, {"type": "builtins.dict", "context": "[names]", ...}]).
absl::StatusOr<std::vector<std::string>> OutputNames(const std::vector<std::string>& call_spec) {
  try {
    if (call_spec.size() != 2) throw std::runtime_error("call spec has no output tree");
    const json out = json::parse(call_spec[1]);
    const json& tree = out.at(1);
    if (tree.at("type") != "builtins.dict") throw std::runtime_error("the outputs are not a dict");
    return json::parse(tree.at("context").get<std::string>()).get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the output names from the call spec: ", FirstLine(e.what())));
  }
}

// Two packages opened at once from two threads corrupt the heap (seen once in 25 server starts
// loading the two demo packages in parallel: "malloc(): unaligned tcache chunk detected"), so
// opening and closing packages take turns; running them is thread-safe.
absl::Mutex package_mu(absl::kConstInit);

struct CloseInTurn {
  void operator()(AOTIModelPackageLoader* loader) const {
    absl::MutexLock lock(&package_mu);
    delete loader;
  }
};
using LoaderPtr = std::unique_ptr<AOTIModelPackageLoader, CloseInTurn>;

// One compiled method of a package and the loaders that run it. On the CPU a single loader holds a
// runner per instance and hands each call a free one. On a GPU that hand-off cannot be captured into
// a CUDA graph: the loader finds a free runner by querying the CUDA event of its last run, which a
// capture forbids ("operation not permitted when stream is capturing", seen on an H100). So there
// each instance gets a loader of its own that runs single-threaded -- it launches the kernels and
// nothing else, so its forward captures -- and a call borrows an idle one. The cost: each of those
// loaders holds its own copy of the weights on the GPU.
class Method {
 public:
  // `single_threaded`: each loader runs one call at a time (a GPU's), so a call borrows one.
  Method(std::vector<LoaderPtr> loaders, std::vector<std::string> names, bool single_threaded)
      : loaders_(std::move(loaders)), names_(std::move(names)), single_threaded_(single_threaded) {
    for (size_t i = 0; i < loaders_.size(); ++i) idle_.push_back(i);
  }

  const std::vector<std::string>& names() const { return names_; }

  // `instance` >= 0: that instance's loader (a graph's capture, which must record the kernels of the
  // loader it will replay as); -1: any idle one.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs, void* stream, int instance = -1) const {
    if (!single_threaded_) return loaders_.front()->run(inputs, stream);
    const size_t i = Borrow(instance);
    struct GiveBack {
      const Method* method;
      size_t i;
      ~GiveBack() { method->Return(i); }
    } give_back{this, i};
    return loaders_[i]->run(inputs, stream);
  }

 private:
  // At most `instances` threads call at once, so one is idle when a call comes; the wait is a guard.
  // `instance` >= 0 waits for that loader (taken modulo the loaders).
  size_t Borrow(int instance) const {
    absl::MutexLock lock(&mu_);
    struct Wanted {
      std::vector<size_t>* idle;
      int want;  // -1: any
    } wanted{&idle_, instance < 0 ? -1 : static_cast<int>(static_cast<size_t>(instance) % loaders_.size())};
    mu_.Await(absl::Condition(
        +[](Wanted* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return w->want < 0 ? !w->idle->empty()
                             : std::count(w->idle->begin(), w->idle->end(), static_cast<size_t>(w->want)) > 0;
        },
        &wanted));
    const auto it =
        wanted.want < 0 ? idle_.end() - 1 : std::find(idle_.begin(), idle_.end(), static_cast<size_t>(wanted.want));
    const size_t i = *it;
    idle_.erase(it);
    return i;
  }
  void Return(size_t i) const {
    absl::MutexLock lock(&mu_);
    idle_.push_back(i);
  }

  std::vector<LoaderPtr> loaders_;
  std::vector<std::string> names_;
  bool single_threaded_;
  mutable absl::Mutex mu_;
  mutable std::vector<size_t> idle_ ABSL_GUARDED_BY(mu_);
};

class AotiModel final : public Model {
 public:
  AotiModel(Manifest manifest, Vocabulary vocabulary, c10::Device device, std::string file, PackageInfo info,
            std::unique_ptr<Method> full, std::unique_ptr<Method> lean)
      : Model(std::move(manifest), std::move(vocabulary), device, std::move(file)),
        info_(std::move(info)),
        full_(std::move(full)),
        lean_(std::move(lean)) {}

  std::string format() const override { return "pt2"; }
  std::string precision() const override { return info_.dtype; }
  std::string compile_note() const override {
    if (!info_.freezing) return "";
    const std::string what = *info_.freezing ? "frozen weights" : "weights not frozen";
    return info_.freezing_kept_by.empty() ? what : absl::StrCat(what, " (the faster on the compiling CPU)");
  }
  bool has_forward_without_maps() const override { return lean_ != nullptr; }
  const CrfScores* crf() const override { return info_.crf ? &*info_.crf : nullptr; }
  // A tagger's tags are decoded on the host in Launch (Finish), which waits for the device there.
  bool asynchronous() const override { return Model::asynchronous() && !info_.crf; }
  using Model::ReadSubwordTokenizer;
  using Model::WarmUp;

 protected:
  ModelOutputs Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const override {
    return RunOn(-1, ids, mask, maps);
  }
  // Each instance's graphs are captured through its own loader (on a GPU each instance has one):
  // captured one after another, they would otherwise all record the one loader that happens to be idle,
  // and every instance would replay that loader's kernels on its own stream.
  ModelOutputs RunInstance(int instance, const at::Tensor& ids, const at::Tensor& mask, bool maps) const override {
    return RunOn(instance, ids, mask, maps);
  }

 private:
  // Run on instance `instance`'s loader, or any idle one (-1).
  ModelOutputs RunOn(int instance, const at::Tensor& ids_in, const at::Tensor& mask_in, bool maps) const {
    // The package's CPU kernels open OpenMP teams as large as the calling thread's OpenMP setting
    // (they are compiled with dynamic threads, pt2.py). A thread starts with OpenMP's default, every
    // core; give each instance thread torch's intra-op count once, as torch's own kernels do.
    static thread_local const bool threads_set = (at::init_num_threads(), true);
    (void)threads_set;
    const Method& method = maps || !lean_ ? *full_ : *lean_;
    const int64_t tokens = ids_in.size(1);
    at::Tensor ids = ids_in, mask = mask_in;
    // The package's shapes start at min_tokens: pad shorter batches (padding changes no answer)
    // and cut the outputs back below.
    const int64_t pad = std::max<int64_t>(info_.min_tokens - tokens, 0);
    if (pad > 0) {
      ids = at::constant_pad_nd(ids, {0, pad}, 0);
      mask = at::constant_pad_nd(mask, {0, pad}, 0);
    }
    void* stream = nullptr;
    if (torch_device().is_cuda()) {
      c10::impl::VirtualGuardImpl impl(torch_device().type());
      stream = impl.getStream(torch_device()).native_handle();
    }
    std::vector<std::vector<at::Tensor>> chunks;
    for (int64_t begin = 0; begin < ids.size(0); begin += info_.max_batch) {
      const int64_t end = std::min(ids.size(0), begin + info_.max_batch);
      std::vector<at::Tensor> outs =
          method.Run({ids.slice(0, begin, end).contiguous(), mask.slice(0, begin, end).contiguous()}, stream, instance);
      if (outs.size() != method.names().size()) {
        throw std::runtime_error(absl::StrCat("the package returned ", outs.size(), " outputs; its call spec names ",
                                              method.names().size()));
      }
      chunks.push_back(std::move(outs));
    }
    ModelOutputs out;
    for (size_t i = 0; i < method.names().size(); ++i) {
      // Names the catalogue has no model tensor for cannot be asked for: left out.
      const std::optional<Output> output = OutputNamed(method.names()[i]);
      if (!output || Row(*output).model_shape == nullptr) continue;
      at::Tensor t;
      if (chunks.size() == 1) {
        t = std::move(chunks[0][i]);
      } else {
        std::vector<at::Tensor> parts;
        for (auto& c : chunks) parts.push_back(std::move(c[i]));
        t = at::cat(parts, 0);
      }
      if (pad > 0) t = NarrowTokens(*output, t, tokens);
      out[*output] = std::move(t);
    }
    return out;
  }

 protected:
  // The tags, decoded on the host from the emissions (the package stops there: see model_store).
  void Finish(ModelOutputs& out, const at::Tensor& mask) const override {
    if (!info_.crf || !out.has(Output::kEmissions)) return;
    absl::StatusOr<at::Tensor> tags = ViterbiDecode(*info_.crf, out[Output::kEmissions], mask);
    if (!tags.ok()) throw std::runtime_error(std::string(tags.status().message()));
    out[Output::kTags] = *std::move(tags);
  }

 private:
  PackageInfo info_;
  std::unique_ptr<Method> full_;
  std::unique_ptr<Method> lean_;  // null when the package has no "without_maps"
};

// A package's compiled code links libtorch.so, which this server does not (it needs only
// libtorch_cpu.so and libc10.so); loaded once from beside libtorch_cpu.so, its name is then found
// when the package is opened.
absl::Status LoadLibTorch() {
  static const absl::Status status = [] {
    const std::string dir = TorchLibraryDir();
    if (dir.empty()) return absl::FailedPreconditionError("cannot locate libtorch_cpu.so in this process");
    const std::string path = (std::filesystem::path(dir) / "libtorch.so").string();
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* error = dlerror();
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot load ", path, ", which AOTInductor packages need: ", error != nullptr ? error : "unknown error"));
    }
    return absl::OkStatus();
  }();
  return status;
}

// AOTIModelPackageLoader extracts each method into a fresh /tmp/XXXXXX folder (the path is fixed in
// LibTorch; TMPDIR is not read) and removes it only in its destructor, so every server that dies
// without unloading (SIGKILL, OOM kill, a crash) left 10-20 MB behind: 1,757 of them once filled this
// project's CI disk. The folders whose libraries this process has mapped are found in
// /proc/self/maps; a CPU method needs nothing from its folder once loaded (the library stays mapped
// after its file is unlinked, the weights are read at construction), so it is removed at once. A CUDA
// method keeps its folder: its kernels are read from the cubin files in it on first use.
std::set<std::string> MappedPackageFolders() {
  constexpr std::string_view kInside = "/model/data/aotinductor/";
  std::set<std::string> folders;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t inside = line.find(kInside);
    const size_t start = line.find('/');
    if (inside == std::string::npos || start >= inside || absl::EndsWith(line, " (deleted)")) continue;
    folders.insert(line.substr(start, inside - start));
  }
  return folders;
}

void RemoveExtractedFolders(const std::set<std::string>& before) {
  for (const std::string& folder : MappedPackageFolders()) {
    if (before.count(folder)) continue;
    std::error_code ignored;  // best effort: a folder left behind costs disk, not correctness
    std::filesystem::remove_all(folder, ignored);
  }
}

absl::StatusOr<std::unique_ptr<Method>> LoadMethod(const std::string& path, const std::string& name,
                                                   const c10::Device& device, int instances,
                                                   const std::vector<std::string>& expected) {
  // The CPU: one loader with a runner per instance. A GPU: a single-threaded loader per instance (Method).
  const size_t count = device.is_cuda() ? static_cast<size_t>(std::max(instances, 1)) : 1;
  const size_t runners = device.is_cuda() ? 1 : static_cast<size_t>(std::max(instances, 1));
  std::vector<LoaderPtr> loaders;  // declared before the lock: on an error they close after it is released
  std::vector<std::string> names;
  absl::MutexLock lock(&package_mu);
  const std::set<std::string> mapped_before = MappedPackageFolders();
  try {
    for (size_t i = 0; i < count; ++i) {
      loaders.emplace_back(new AOTIModelPackageLoader(path, name, /*run_single_threaded=*/device.is_cuda(), runners,
                                                      device.is_cuda() ? device.index() : -1));
    }
    absl::StatusOr<std::vector<std::string>> read = OutputNames(loaders.front()->get_call_spec());
    if (!read.ok()) return read.status();
    names = *std::move(read);
    if (!device.is_cuda()) RemoveExtractedFolders(mapped_before);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load '", name, "' of ", path, ": ", FirstLine(e.what())));
  }
  if (names != expected) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": '", name, "' returns [", absl::StrJoin(names, ","),
                                                   "] but pt2.json says [", absl::StrJoin(expected, ","), "]"));
  }
  return std::make_unique<Method>(std::move(loaders), std::move(names), /*single_threaded=*/device.is_cuda());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadAotInductor(const std::string& path, const c10::Device& device,
                                                       int instances) {
  std::string manifest_json, vocab_txt, info_json, tokenizer_json;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    auto read = [&](const std::string& record, std::string& out) {
      if (!reader.hasRecord(record)) throw std::runtime_error(absl::StrCat("it has no ", record));
      auto [data, size] = reader.getRecord(record);
      out.assign(static_cast<const char*>(data.get()), size);
    };
    read("extra/pt2.json", info_json);
    read("extra/manifest.json", manifest_json);
    // A sub-word model carries tokenizer.json for vocab.txt (ParseArtifactFiles says which it needs).
    for (auto [record, out] : {std::pair{"extra/vocab.txt", &vocab_txt}, {"extra/tokenizer.json", &tokenizer_json}}) {
      if (reader.hasRecord(record)) read(record, *out);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, " as a PT2 package: ", FirstLine(e.what())));
  }
  absl::StatusOr<PackageInfo> info = ParseInfo(info_json, path);
  if (!info.ok()) return info.status();
  if (absl::Status s = CheckRunsHere(*info, path, device); !s.ok()) return s;
  absl::StatusOr<std::pair<Manifest, Vocabulary>> files = ParseArtifactFiles(manifest_json, vocab_txt, path);
  if (!files.ok()) return files.status();
  if (info->crf && info->crf->num_tags() != static_cast<int>(files->first.tags.size())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the CRF has ", info->crf->num_tags(),
                                                   " tags but the manifest ", files->first.tags.size()));
  }
  if (absl::Status s = LoadLibTorch(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Method>> full = LoadMethod(path, "model", device, instances, info->outputs["model"]);
  if (!full.ok()) return full.status();
  std::unique_ptr<Method> lean;
  if (info->outputs.count("without_maps")) {
    absl::StatusOr<std::unique_ptr<Method>> m =
        LoadMethod(path, "without_maps", device, instances, info->outputs["without_maps"]);
    if (!m.ok()) return m.status();
    lean = *std::move(m);
  }
  auto model = std::make_unique<AotiModel>(std::move(files->first), std::move(files->second), device, path,
                                           *std::move(info), *std::move(full), std::move(lean));
  if (absl::Status s = model->ReadSubwordTokenizer(tokenizer_json); !s.ok()) return s;
  if (absl::Status s = model->WarmUp(); !s.ok()) return s;
  return model;
}

}  // namespace qvi
