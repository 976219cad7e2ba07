// A forward pass's outputs, one tensor per catalogue entry (outputs.h) the model computed.
#ifndef QVI_SERVER_CORE_MODEL_MODEL_OUTPUTS_H_
#define QVI_SERVER_CORE_MODEL_MODEL_OUTPUTS_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/core/outputs/outputs.h"

namespace qvi {

class ModelOutputs {
 public:
  bool has(Output output) const { return tensors_[Index(output)].defined(); }
  // The tensor of `output`; std::out_of_range when it was not computed.
  const at::Tensor& at(Output output) const {
    if (!has(output)) throw std::out_of_range(std::string("no output ") + OutputName(output));
    return tensors_[Index(output)];
  }
  at::Tensor& operator[](Output output) { return tensors_[Index(output)]; }
  void erase(Output output) { tensors_[Index(output)] = at::Tensor(); }
  OutputSet present() const {
    OutputSet set;
    for (size_t i = 0; i < kOutputCount; ++i) set[i] = tensors_[i].defined();
    return set;
  }
  // Calls f(output, tensor) for every output computed, in the catalogue's order.
  template <typename F>
  void ForEach(F&& f) {
    for (size_t i = 0; i < kOutputCount; ++i) {
      if (tensors_[i].defined()) f(static_cast<Output>(i), tensors_[i]);
    }
  }
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < kOutputCount; ++i) {
      if (tensors_[i].defined()) f(static_cast<Output>(i), tensors_[i]);
    }
  }

  // The backends' outputs by name (a TorchScript dict, an AOTInductor package's list): names the
  // catalogue has no model tensor for are left out, since nothing can ask for them.
  static ModelOutputs FromNamed(const std::map<std::string, at::Tensor>& named) {
    ModelOutputs out;
    for (const auto& [name, t] : named) {
      if (std::optional<Output> o = OutputNamed(name); o && Row(*o).model_shape != nullptr) out[*o] = t;
    }
    return out;
  }

  // After a selection of layers and heads (OutputSelection), the original layer and head at each
  // position of the per-layer outputs (int64); head_index is {-1} when the heads were averaged.
  at::Tensor layer_index, head_index;

  // options.faithfulness (ModelRunner::RunChecks): per batch row, its row of check_logits (-1 when
  // the text did not ask) and the token positions deleted for it, ascending; check_logits holds the
  // logits of the texts that asked, with those tokens deleted.
  std::vector<int64_t> check_row;
  std::vector<std::vector<int64_t>> check_removed;
  at::Tensor check_logits;

  // How long the device was busy with this forward pass, where the backend knows it: the null
  // model's emulated device (null_model.h). Zero from the backends that do not measure it.
  absl::Duration device_time;

  // Set by a backend whose device is still computing these outputs when Run returns (the null
  // model's emulated device): waits until it is done, and may throw when the device failed. Model
  // calls it before anything reads the outputs (Model::Collect); empty when they are ready.
  std::function<void()> wait_for_device;

 private:
  static size_t Index(Output output) { return static_cast<size_t>(output); }
  std::array<at::Tensor, kOutputCount> tensors_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_MODEL_OUTPUTS_H_
