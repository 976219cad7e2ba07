#include "tests/cpp/test_util/fake_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>

#include <stdexcept>

namespace qvi {

ModelOutputs FakeModel::Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const {
  ++(maps ? with_maps_ : without_maps_);
  const int launch = ++launches_;
  if (on_launch_) on_launch_(launch);
  if (poison_id_ >= 0 && (ids.eq(poison_id_) & mask).any().item<bool>()) {
    throw std::runtime_error("a poisoned batch");
  }
  const at::Tensor real = mask.to(at::kFloat);
  const at::Tensor n = real.sum(1, /*keepdim=*/true).clamp_min(1.0);
  ModelOutputs out;
  out[Output::kLogits] = at::cat({(ids.to(at::kFloat) * real).sum(1, true), real.sum(1, true)}, 1);
  out[Output::kAttention] = real / n;
  out[Output::kGates] = ids.to(at::kFloat) / 100.0 * real;
  const int64_t b = ids.size(0), t = ids.size(1);
  at::Tensor lh = at::arange(kLayers, at::kFloat).view({1, kLayers, 1, 1}) +
                  at::arange(kHeads, at::kFloat).view({1, 1, kHeads, 1}) / 10.0;
  out[Output::kLayerGates] = lh.expand({b, kLayers, kHeads, t}) * real.view({b, 1, 1, t});
  if (bad_from_batch_ > 0 && b >= bad_from_batch_) out[Output::kLogits] = out[Output::kLogits].slice(1, 0, 1);
  if (maps) {
    out[Output::kLayerAttention] = (real / n).view({b, 1, 1, 1, t}).expand({b, kLayers, kHeads, t, t}).contiguous();
  }
  if (wait_) {
    const bool fails = device_failing_id_ >= 0 && (ids.eq(device_failing_id_) & mask).any().item<bool>();
    out.wait_for_device = [wait = wait_, launch, fails] {
      wait(launch);
      if (fails) throw std::runtime_error("the device failed");
    };
  }
  return out;
}

}  // namespace qvi
