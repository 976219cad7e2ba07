// The request side of a ModelRunner (model_runner.h): a request's texts, the timing it reports, and the
// padding of a batch's token ids into the tensors the model takes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <algorithm>

#include "server/core/runner/model_runner.h"

namespace qvi {

RunnableRequest::RunnableRequest(std::vector<std::vector<int64_t>> ids, OutputSet wanted, absl::Time deadline,
                                 std::function<bool()> is_cancelled, RowHandler on_row,
                                 std::function<void(absl::Status)> on_done, OutputSelection selection)
    : BatchRequest(Counts(ids), deadline, std::move(is_cancelled), std::move(on_done)),
      ids_(std::move(ids)),
      wanted_(std::move(wanted)),
      on_row_(std::move(on_row)),
      selection_(std::move(selection)),
      wants_layers_((wanted_ & (OfKind(OutputKind::kPerLayer) | OfKind(OutputKind::kPerLayerMap))).any()),
      texts_(static_cast<int>(ids_.size())) {}

std::vector<int> RunnableRequest::Counts(const std::vector<std::vector<int64_t>>& ids) {
  std::vector<int> counts;
  for (const auto& t : ids) counts.push_back(static_cast<int>(t.size()));
  return counts;
}

void RunnableRequest::RecordTiming(absl::Time queued, absl::Duration queue, absl::Duration forward,
                                   absl::Duration postprocess) {
  MutexLock lock(&timing_mu_);
  timing_.queued = std::min(timing_.queued, queued);
  timing_.queue = std::max(timing_.queue, queue);
  if (forward + postprocess > timing_.compute) {  // the longest batch's, as one pair
    timing_.compute = forward + postprocess;
    timing_.forward = forward;
    timing_.postprocess = postprocess;
  }
}

RunnableRequest::Timing RunnableRequest::timing() const {
  MutexLock lock(&timing_mu_);
  return timing_;
}

PackedBatch PackTokenIds(const std::vector<const std::vector<int64_t>*>& texts) {
  const int64_t rows = static_cast<int64_t>(texts.size());
  int64_t width = 1;
  PackedBatch packed;
  for (const std::vector<int64_t>* text : texts) {
    width = std::max<int64_t>(width, static_cast<int64_t>(text->size()));
    packed.tokens += static_cast<int64_t>(text->size());
  }
  packed.ids = at::zeros({rows, width}, at::kLong);
  packed.mask = at::zeros({rows, width}, at::kBool);
  auto id = packed.ids.accessor<int64_t, 2>();
  auto mk = packed.mask.accessor<bool, 2>();
  for (int64_t b = 0; b < rows; ++b) {
    const std::vector<int64_t>& text = *texts[b];
    for (size_t t = 0; t < text.size(); ++t) {
      id[b][t] = text[t];
      mk[b][t] = true;
    }
  }
  return packed;
}

}  // namespace qvi
