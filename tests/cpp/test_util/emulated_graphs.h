// A GraphBackend (server/core/model/graphs.h) that emulates CUDA graphs on the CPU, for the tests of
// everything around them: buckets, padding, slots, reports. Like a real graph, a "captured" forward
// has static input and output tensors of the captured shape; a replay copies the inputs in, runs the
// forward again and copies its results into the same output tensors, so that a caller that kept a
// graph's output past the next replay sees it change, as it would on a GPU.
#ifndef QVI_TESTS_CPP_TEST_UTIL_EMULATED_GRAPHS_H_
#define QVI_TESTS_CPP_TEST_UTIL_EMULATED_GRAPHS_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/core/manifest/shape_buckets.h"
#include "server/core/model/graphs.h"

namespace qvi {

class EmulatedGraphBackend final : public GraphBackend {
 public:
  // Captures at this shape fail, as a forward with a host synchronisation would on a GPU.
  std::optional<ShapeBucket> fail_at;

  bool Supports(const c10::Device& device) const override { return device.is_cpu(); }
  std::unique_ptr<GraphPool> NewPool(const c10::Device&) override { return std::make_unique<GraphPool>(); }

  absl::StatusOr<std::unique_ptr<CapturedForward>> Capture(const DeviceForward& forward, const at::Tensor& ids,
                                                           const at::Tensor& mask, GraphPool&) override {
    if (fail_at && fail_at->batch == ids.size(0) && fail_at->tokens == ids.size(1)) {
      return absl::FailedPreconditionError("operation not permitted when stream is capturing");
    }
    auto graph = std::make_unique<Graph>(this, forward, ids.clone(), mask.clone());
    graph->outputs.ForEach([&](Output, const at::Tensor& t) { bytes_ += static_cast<int64_t>(t.nbytes()); });
    ++captures_;
    return graph;
  }

  int64_t ReservedBytes(const c10::Device&) const override { return bytes_; }

  int captures() const { return captures_; }
  int replays() const { return replays_; }

 private:
  struct Graph final : CapturedForward {
    Graph(EmulatedGraphBackend* backend, DeviceForward forward, at::Tensor ids, at::Tensor mask)
        : backend(backend), forward(std::move(forward)), ids(std::move(ids)), mask(std::move(mask)) {
      this->forward(this->ids, this->mask).ForEach([&](Output o, const at::Tensor& t) { outputs[o] = t.clone(); });
    }
    const ModelOutputs& Replay(const at::Tensor& new_ids, const at::Tensor& new_mask) override {
      if (!new_ids.sizes().equals(ids.sizes()) || !new_mask.sizes().equals(mask.sizes())) {
        throw std::runtime_error(absl::StrCat("replayed at another shape than captured"));
      }
      ids.copy_(new_ids);
      mask.copy_(new_mask);
      forward(ids, mask).ForEach([&](Output o, const at::Tensor& t) { outputs[o].copy_(t); });
      ++backend->replays_;
      return outputs;
    }
    EmulatedGraphBackend* backend;
    DeviceForward forward;
    at::Tensor ids, mask;
    ModelOutputs outputs;
  };

  std::atomic<int> captures_{0}, replays_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace qvi

#endif  // QVI_TESTS_CPP_TEST_UTIL_EMULATED_GRAPHS_H_
