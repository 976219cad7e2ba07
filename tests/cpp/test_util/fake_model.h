// A Model with no artifact behind it, for the tests of what runs around a model (the runner, the
// repository, Model::Forward's selection and copying): a classifier whose outputs are simple
// functions of the token ids, cheap and exactly predictable.
//
//   logits[b] = {Σ ids of real tokens, number of real tokens}
//   attention[b,t] = 1/n on real tokens, 0 on padding; gates[b,t] = id/100 on real tokens
//   layer_attention[b,l,h,q,k] = 1/n on real keys (when maps are asked for)
//   layer_gates[b,l,h,t] = l + h/10 on real tokens
#ifndef QVI_TESTS_CPP_TEST_UTIL_FAKE_MODEL_H_
#define QVI_TESTS_CPP_TEST_UTIL_FAKE_MODEL_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/model/model.h"

namespace qvi {

class FakeModel final : public Model {
 public:
  static constexpr int kLayers = 2;
  static constexpr int kHeads = 3;

  // `bad_from_batch` > 0: batches of that many texts or more get logits with a column too few, as
  // a model file that contradicts its manifest only at some shapes would.
  static std::unique_ptr<FakeModel> Create(const std::string& name = "fake", int max_tokens = 16,
                                           int bad_from_batch = 0) {
    const std::string manifest_json = absl::StrCat(R"({
      "format_version": 1, "name": ")",
                                                   name, R"(", "task": "classification", "labels": ["sum", "count"],
      "architecture": {"name": "transformer", "display_name": "Fake", "interaction": "qvi",
                       "config": {"layers": )",
                                                   kLayers, R"(, "heads": )", kHeads, R"(}},
      "tokenizer": {"level": "word", "lowercase": true, "max_tokens": )",
                                                   max_tokens, R"(, "vocab_size": 5},
      "outputs": {"logits": {"shape": ["B", "C"]}, "attention": {"shape": ["B", "T"]},
                  "gates": {"shape": ["B", "T"]}, "layer_attention": {"shape": ["B", "L", "H", "T", "T"]},
                  "layer_gates": {"shape": ["B", "L", "H", "T"]}},
      "explanations": ["attention", "gates", "layer_attention", "layer_gates"]})");
    auto files = ParseArtifactFiles(manifest_json, "[PAD]\n[UNK]\nthe\ngood\nbad\n", "fake");
    if (!files.ok()) throw std::runtime_error(std::string(files.status().message()));
    auto model = std::unique_ptr<FakeModel>(new FakeModel(std::move(files->first), std::move(files->second)));
    model->bad_from_batch_ = bad_from_batch;
    return model;
  }

  std::string format() const override { return "fake"; }
  bool has_forward_without_maps() const override { return true; }

  // A batch holding this token id fails (Run throws), whatever its size; -1: none does.
  void set_poison_id(int64_t id) { poison_id_ = id; }

  // An emulated device that computes after Launch returns (asynchronous()), for the runner's
  // pipeline: `on_launch(n)` runs as the n-th batch (1, 2, ...) is launched, `wait(n)` when it is
  // collected (Model::Collect waits for the device there). A batch holding `failing_id` fails on
  // the device: its wait throws, after `wait`. Set before serving.
  void set_device(std::function<void(int)> on_launch, std::function<void(int)> wait, int64_t failing_id = -1) {
    on_launch_ = std::move(on_launch);
    wait_ = std::move(wait);
    device_failing_id_ = failing_id;
  }
  bool asynchronous() const override { return static_cast<bool>(wait_); }

  // How often each instance's graphs ran the model (RunInstance: their captures, and on the tests'
  // emulated graphs their replays too), by instance.
  std::map<int, int> instance_runs() const {
    std::lock_guard<std::mutex> lock(instance_mu_);
    return instance_runs_;
  }

  // How often Run() was called with and without the maps.
  int runs_with_maps() const { return with_maps_; }
  int runs_without_maps() const { return without_maps_; }

 protected:
  ModelOutputs RunInstance(int instance, const at::Tensor& ids, const at::Tensor& mask, bool maps) const override {
    {
      std::lock_guard<std::mutex> lock(instance_mu_);
      ++instance_runs_[instance];
    }
    return Run(ids, mask, maps);
  }

  ModelOutputs Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const override;

 private:
  FakeModel(Manifest manifest, Vocabulary vocabulary)
      : Model(std::move(manifest), std::move(vocabulary), c10::Device(c10::kCPU), "fake") {}

  mutable std::atomic<int> with_maps_{0}, without_maps_{0}, launches_{0};
  std::function<void(int)> on_launch_, wait_;
  mutable std::mutex instance_mu_;
  mutable std::map<int, int> instance_runs_;
  int64_t device_failing_id_ = -1;
  int64_t poison_id_ = -1;
  int bad_from_batch_ = 0;
};

}  // namespace qvi

#endif  // QVI_TESTS_CPP_TEST_UTIL_FAKE_MODEL_H_
