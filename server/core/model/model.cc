#include "server/core/model/model.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <c10/core/Event.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <set>
#include <thread>

#include "absl/time/time.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace qvi {
namespace {

// A model file is untrusted input too: its outputs must have the shapes and types the catalogue
// gives them before post-processing indexes into them. B is the batch, T its width, C the labels, K
// the tags; L and H (layers, heads) may be any size.
absl::Status CheckOutputs(const Manifest& m, const ModelOutputs& out, int64_t batch, int64_t width) {
  absl::Status status;
  out.ForEach([&](Output output, const at::Tensor& t) {
    if (!status.ok()) return;
    const OutputRow& row = Row(output);
    const std::vector<std::string> dims = absl::StrSplit(row.model_shape, ',');
    bool ok = t.dim() == static_cast<int64_t>(dims.size()) &&
              (row.model_int64 ? t.scalar_type() == at::kLong : t.is_floating_point());
    std::string want;
    for (size_t d = 0; d < dims.size(); ++d) {
      int64_t size = -1;
      if (dims[d] == "B") size = batch;
      if (dims[d] == "T") size = width;
      if (dims[d] == "C") size = static_cast<int64_t>(m.labels.size());
      if (dims[d] == "K") size = static_cast<int64_t>(m.tags.size());
      if (ok && size >= 0 && t.size(static_cast<int64_t>(d)) != size) ok = false;
      absl::StrAppend(&want, d == 0 ? "" : ",", size >= 0 ? std::to_string(size) : dims[d]);
    }
    if (ok) return;
    std::string got;
    for (int64_t d : t.sizes()) got += (got.empty() ? "" : ",") + std::to_string(d);
    status = absl::InternalError(absl::StrCat("model '", m.name, "' returned ", row.name, " of shape [", got,
                                              "] and type ", std::string(c10::toString(t.scalar_type())), "; expected ",
                                              row.model_int64 ? "int64" : "float", " [", want, "]"));
  });
  return status;
}

}  // namespace

Model::Model(Manifest manifest, Vocabulary vocabulary, c10::Device device, std::string file)
    : manifest_(std::make_shared<const Manifest>(std::move(manifest))),
      vocabulary_(std::move(vocabulary)),
      tokenizer_(manifest_->tokenizer),
      device_(device),
      file_(std::move(file)) {}

absl::Status Model::WarmUp() {
  at::Tensor ids = at::full({2, 4}, Vocabulary::kUnkId, at::kLong);
  at::Tensor mask = at::ones({2, 4}, at::kBool);
  mask[1].slice(/*dim=*/0, /*start=*/2).fill_(false);
  const OutputSet all = OutputsOfModel(*manifest_);
  OutputSet lean_wanted = all;
  lean_wanted.reset(static_cast<size_t>(Output::kLayerAttention));
  OutputSet full, lean;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ModelOutputs> out = Forward(ids, mask, all);
    if (!out.ok()) return absl::InvalidArgumentError(absl::StrCat("warm-up failed: ", out.status().message()));
    full = out->present();
  }
  if (!has_forward_without_maps()) return absl::OkStatus();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ModelOutputs> out = Forward(ids, mask, lean_wanted);
    if (!out.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("warm-up of the forward without maps failed: ", out.status().message()));
    }
    lean = out->present();
  }
  full.reset(static_cast<size_t>(Output::kLayerAttention));
  if (full != lean) {
    auto names = [](const OutputSet& set) {
      std::vector<std::string> out;
      for (Output o : InOrder(set)) out.push_back(OutputName(o));
      return absl::StrJoin(out, ",");
    };
    return absl::InvalidArgumentError(absl::StrCat("the forward without maps returns [", names(lean),
                                                   "] but forward returns [", names(full),
                                                   "] besides layer_attention; they must agree"));
  }
  return absl::OkStatus();
}

at::Tensor Model::NarrowTokens(Output output, at::Tensor t, int64_t tokens) {
  const char* shape = Row(output).model_shape;
  if (shape == nullptr) return t;
  int64_t d = 0;
  for (absl::string_view dim : absl::StrSplit(shape, ',')) {
    if (d >= t.dim()) break;
    if (dim == "T" && t.size(d) > tokens) t = t.narrow(d, 0, tokens);
    ++d;
  }
  return t;
}

absl::Status Model::PrepareGraphs(const ServingConfig& serving, GraphBackend* backend, const std::string& backend_note,
                                  const Env* env) {
  graph_slots_.clear();
  graph_report_ = GraphReport{};
  const GraphSettings& settings = serving.cuda_graphs;
  if (!settings.enabled) {
    graph_report_.note = "off (--cuda-graphs=false or serving.json \"cuda_graphs\")";
    return absl::OkStatus();
  }
  if (backend == nullptr || !backend->Supports(device_)) {
    graph_report_.note = device_.is_cuda() ? backend_note : "none on the CPU";
    return absl::OkStatus();
  }
  const int64_t max_batch = serving.max_batch_size;
  const int64_t max_tokens = manifest_->tokenizer.max_tokens;
  std::vector<int64_t> batch_sizes =
      settings.batch_sizes.empty() ? PowersOfTwoUpTo(1, max_batch) : settings.batch_sizes;
  std::vector<int64_t> lengths = settings.lengths.empty() ? PowersOfTwoUpTo(8, max_tokens) : settings.lengths;
  if (absl::Status s = ShapeBuckets::Check(batch_sizes, lengths, max_batch, max_tokens, "serving.json: 'cuda_graphs'");
      !s.ok()) {
    return s;
  }
  graph_report_.batch_sizes = batch_sizes;
  graph_report_.lengths = lengths;
  ShapeBuckets buckets(std::move(batch_sizes), std::move(lengths));
  // The forward a batch without maps runs; batches that ask for the maps run without a graph (their
  // [B,L,H,T,T] outputs would be kept per bucket and per instance).
  const bool maps = !has_forward_without_maps();
  const absl::Time start = env->Now();
  const int64_t reserved_before = backend->ReservedBytes(device_);
  std::vector<std::unique_ptr<GraphSlot>> slots;
  try {
    c10::InferenceMode guard;
    for (int i = 0; i < std::max(serving.instances, 1); ++i) {
      auto slot = std::make_unique<GraphSlot>();
      slot->pool = backend->NewPool(device_);
      const DeviceForward forward = [this, i, maps](const at::Tensor& ids, const at::Tensor& mask) {
        return RunInstance(i, ids, mask, maps);
      };
      for (const ShapeBucket& bucket : buckets.All()) {
        const at::Tensor ids = at::full({bucket.batch, bucket.tokens}, Vocabulary::kUnkId,
                                        at::TensorOptions().dtype(at::kLong).device(device_));
        const at::Tensor mask =
            at::ones({bucket.batch, bucket.tokens}, at::TensorOptions().dtype(at::kBool).device(device_));
        absl::StatusOr<std::unique_ptr<CapturedForward>> graph = backend->Capture(forward, ids, mask, *slot->pool);
        if (!graph.ok()) {
          graph_report_.note = absl::StrCat("capture failed at ", bucket.batch, " texts × ", bucket.tokens,
                                            " tokens, so it runs without graphs: ", graph.status().message());
          return absl::OkStatus();
        }
        slot->graphs[bucket] = *std::move(graph);
      }
      slots.push_back(std::move(slot));
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    graph_report_.note = absl::StrCat("capture failed, so it runs without graphs: ", what.substr(0, what.find('\n')));
    return absl::OkStatus();
  }
  graph_report_.active = true;
  graph_report_.graphs = static_cast<int64_t>(slots.size() * buckets.size());
  graph_report_.capture_ms = absl::ToDoubleMilliseconds(env->Now() - start);
  graph_report_.memory_bytes = std::max<int64_t>(backend->ReservedBytes(device_) - reserved_before, 0);
  graph_report_.note = absl::StrCat(graph_report_.graphs, " graphs (", slots.size(), " instance(s) × ", buckets.size(),
                                    " shapes) of the forward ", maps ? "with" : "without", " maps");
  graph_slots_ = std::move(slots);
  buckets_ = std::move(buckets);
  return absl::OkStatus();
}

Model::GraphSlot* Model::AcquireGraphSlot() const {
  // On a GPU the slot this thread already holds on its stream comes first: the batch's copies and
  // replay are then queued after that thread's earlier batches and their copies to the host, so that
  // the thread that launches the next batch before collecting the last one keeps its graphs. Only
  // the same thread: two threads copying into one graph's inputs at once would mix their batches.
  // On the CPU (the tests' emulated graphs) a replay is done when Launch returns, which lets go of
  // the slot there.
  std::optional<c10::StreamId> stream;
  if (device_.is_cuda()) stream = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_).id();
  const std::thread::id thread = std::this_thread::get_id();
  MutexLock lock(&slots_mu_);
  if (stream) {
    for (const std::unique_ptr<GraphSlot>& slot : graph_slots_) {
      if (slot->users > 0 && slot->thread == thread && slot->stream == *stream) {
        ++slot->users;
        return slot.get();
      }
    }
  }
  for (const std::unique_ptr<GraphSlot>& slot : graph_slots_) {
    if (slot->users == 0) {
      slot->users = 1;
      slot->thread = thread;
      slot->stream = stream.value_or(0);
      return slot.get();
    }
  }
  return nullptr;
}

void Model::ReleaseGraphSlot(GraphSlot* slot) const {
  MutexLock lock(&slots_mu_);
  --slot->users;
}

ModelOutputs Model::Replay(GraphSlot& slot, const ShapeBucket& bucket, const at::Tensor& ids,
                           const at::Tensor& mask) const {
  const int64_t batch = ids.size(0), tokens = ids.size(1);
  at::Tensor padded_ids = ids, padded_mask = mask;
  if (bucket.batch > batch || bucket.tokens > tokens) {
    // Padding changes no text's answer (model_store's padding tests); the rows added to fill the
    // bucket hold one unknown token each, so that no row is all padding.
    const std::vector<int64_t> pad{0, bucket.tokens - tokens, 0, bucket.batch - batch};
    padded_ids = at::constant_pad_nd(ids, pad, 0);
    padded_mask = at::constant_pad_nd(mask, pad, 0);
    if (bucket.batch > batch) {
      padded_ids.slice(0, batch).select(1, 0).fill_(Vocabulary::kUnkId);
      padded_mask.slice(0, batch).select(1, 0).fill_(true);
    }
  }
  ModelOutputs result;
  slot.graphs.at(bucket)->Replay(padded_ids, padded_mask).ForEach([&](Output o, const at::Tensor& t) {
    result[o] = NarrowTokens(o, t.narrow(0, 0, batch), tokens);
  });
  return result;
}

namespace {

// Only the selected layers and heads of the per-layer outputs leave the device: the index tensors,
// made once per batch (on the CPU for the answer, on the device for index_select).
struct LayerPick {
  at::Tensor layers, heads, layers_on_device, heads_on_device;
  LayerPick(const OutputSelection& selection, const c10::Device& device) {
    if (!selection.layers.empty()) {
      layers = at::tensor(selection.layers, at::kLong);
      layers_on_device = layers.to(device);
    }
    if (!selection.heads.empty()) {
      heads = at::tensor(selection.heads, at::kLong);
      heads_on_device = heads.to(device);
    }
  }
};

}  // namespace

namespace {

// Cuts the per-layer outputs to the layers and heads selected (and averages the heads when asked),
// on their device.
absl::Status SelectLayers(ModelOutputs& out, const OutputSelection& selection, std::optional<LayerPick>& pick) {
  absl::Status picked;
  out.ForEach([&](Output o, at::Tensor& t) {
    const OutputKind kind = Row(o).kind;
    if (!picked.ok() || (kind != OutputKind::kPerLayer && kind != OutputKind::kPerLayerMap)) return;
    if (!pick) pick.emplace(selection, t.device());
    if (pick->layers.defined()) {
      if (selection.layers.back() >= t.size(1)) picked = absl::InternalError("layer selection out of range");
      if (!picked.ok()) return;
      t = t.index_select(1, pick->layers_on_device);
    }
    if (pick->heads.defined()) {
      if (selection.heads.back() >= t.size(2)) picked = absl::InternalError("head selection out of range");
      if (!picked.ok()) return;
      t = t.index_select(2, pick->heads_on_device);
    }
    if (selection.mean_heads) t = t.mean(2, /*keepdim=*/true);
  });
  return picked;
}

// On a GPU each copy is queued without waiting, into pinned memory from torch's host cache
// (non-blocking copies to the CPU allocate it so); one event recorded after them then says when they
// are all done: one synchronisation of the instance's stream per batch, not one per output, and
// none of the device. Returns the wait for it.
std::function<void()> CopyToHost(ModelOutputs& out, const c10::Device& device) {
  out.ForEach([](Output, at::Tensor& t) { t = t.to(t.options().device(at::kCPU), /*non_blocking=*/true); });
  c10::impl::VirtualGuardImpl impl(device.type());
  auto copied = std::make_shared<c10::Event>(device.type());
  copied->record(impl.getStream(device));
  return [copied] { copied->synchronize(); };
}

}  // namespace

ModelOutputs Model::RunBatch(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                             LaunchedForward& launched, GraphSlot*& slot) const {
  const bool cuda = device_.is_cuda();
  const bool maps = wanted.test(static_cast<size_t>(Output::kLayerAttention)) || !has_forward_without_maps();
  std::optional<ShapeBucket> bucket;
  if (!maps && !graph_slots_.empty()) bucket = buckets_.Fit(ids.size(0), ids.size(1));
  if (bucket) slot = AcquireGraphSlot();
  if (slot != nullptr) launched.release_ = [this, held = slot] { ReleaseGraphSlot(held); };
  // On a GPU the inputs go from pinned memory (torch's host cache, which keeps each block until the
  // stream's copy of it is done), so that their copies do not wait for the host either.
  const at::Tensor host_ids = cuda ? ids.pin_memory() : ids;
  const at::Tensor host_mask = cuda ? mask.pin_memory() : mask;
  ModelOutputs result = slot != nullptr ? Replay(*slot, *bucket, host_ids, host_mask)
                                        : Run(cuda ? host_ids.to(device_, /*non_blocking=*/true) : ids,
                                              cuda ? host_mask.to(device_, /*non_blocking=*/true) : mask, maps);
  Finish(result, mask);
  ModelOutputs out;
  out.device_time = result.device_time;
  out.wait_for_device = std::move(result.wait_for_device);
  for (Output o : InOrder(wanted)) {
    if (result.has(o)) out[o] = std::move(result[o]);
  }
  return out;
}

LaunchedForward::LaunchedForward(LaunchedForward&& other) noexcept
    : outputs_(std::move(other.outputs_)),
      wait_(std::exchange(other.wait_, nullptr)),
      release_(std::exchange(other.release_, nullptr)) {}

LaunchedForward& LaunchedForward::operator=(LaunchedForward&& other) noexcept {
  if (this == &other) return *this;
  try {
    Settle();
  } catch (...) {  // a device that failed: nothing to hand to anyone now
  }
  outputs_ = std::move(other.outputs_);
  wait_ = std::exchange(other.wait_, nullptr);
  release_ = std::exchange(other.release_, nullptr);
  return *this;
}

LaunchedForward::~LaunchedForward() {
  try {
    Settle();
  } catch (...) {  // a device that failed: nothing to hand to anyone now
  }
}

void LaunchedForward::Settle() {
  // The slot is let go on every path, and only after the device is done with its buffers.
  struct Release {
    std::function<void()>& release;
    ~Release() {
      if (release) std::exchange(release, nullptr)();
    }
  } release{release_};
  if (wait_) std::exchange(wait_, nullptr)();
}

absl::StatusOr<LaunchedForward> Model::Launch(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                                              const OutputSelection& selection) const {
  LaunchedForward launched;  // dropped on an error: waits for the device, lets go of the slot
  GraphSlot* slot = nullptr;
  try {
    c10::InferenceMode guard;
    ModelOutputs out = RunBatch(ids, mask, wanted, launched, slot);
    launched.wait_ = std::move(out.wait_for_device);
    if (absl::Status s = CheckOutputs(*manifest_, out, ids.size(0), ids.size(1)); !s.ok()) return s;
    std::optional<LayerPick> pick;
    if (absl::Status s = SelectLayers(out, selection, pick); !s.ok()) return s;
    if (device_.is_cuda()) {
      std::function<void()> copied = CopyToHost(out, device_);
      launched.wait_ = [device = std::move(launched.wait_), copied = std::move(copied)] {
        if (device) device();
        copied();
      };
    }
    if (pick) {
      out.layer_index = pick->layers;
      out.head_index = selection.mean_heads ? at::tensor(std::vector<int64_t>{-1}, at::kLong) : pick->heads;
    }
    // On the CPU (the tests' emulated graphs) nothing was copied: the answer must not be the graph's
    // buffer, which the next replay overwrites; cloned here, then the slot let go (not before: another
    // thread may replay into the buffer as soon as it is free).
    if (slot != nullptr && !device_.is_cuda()) {
      out.ForEach([](Output, at::Tensor& t) { t = t.clone(); });
      launched.Settle();
    }
    launched.outputs_ = std::move(out);
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InternalError(absl::StrCat("model failed: ", what.substr(0, what.find('\n'))));
  }
  return launched;
}

absl::StatusOr<ModelOutputs> Model::Collect(LaunchedForward launched) const {
  try {
    c10::InferenceMode guard;
    launched.Settle();
    ModelOutputs out = std::move(launched.outputs_);
    // A half-precision model (bf16, fp16) answers in float32 like any other: converted after the
    // copy, which then moves half the bytes.
    out.ForEach([](Output, at::Tensor& t) {
      if (t.is_floating_point() && t.scalar_type() != at::kFloat) t = t.to(at::kFloat);
    });
    return out;
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InternalError(absl::StrCat("model failed: ", what.substr(0, what.find('\n'))));
  }
}

absl::StatusOr<ModelOutputs> Model::Forward(const at::Tensor& ids, const at::Tensor& mask, const OutputSet& wanted,
                                            const OutputSelection& selection) const {
  absl::StatusOr<LaunchedForward> launched = Launch(ids, mask, wanted, selection);
  if (!launched.ok()) return launched.status();
  return Collect(*std::move(launched));
}

}  // namespace qvi
