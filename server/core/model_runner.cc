#include "server/core/model_runner.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace qvi {

RunnableRequest::RunnableRequest(std::vector<std::vector<int64_t>> ids, std::vector<std::string> wanted,
                                 absl::Time deadline, std::function<bool()> is_cancelled, RowHandler on_row,
                                 std::function<void(absl::Status)> on_done)
    : BatchRequest(Counts(ids), deadline, std::move(is_cancelled), std::move(on_done)),
      ids_(std::move(ids)),
      wanted_(std::move(wanted)),
      on_row_(std::move(on_row)) {}

std::vector<int> RunnableRequest::Counts(const std::vector<std::vector<int64_t>>& ids) {
  std::vector<int> counts;
  for (const auto& t : ids) counts.push_back(static_cast<int>(t.size()));
  return counts;
}

ModelRunner::ModelRunner(std::shared_ptr<const Model> model, std::unique_ptr<BatchScheduler> scheduler,
                         const Clock* clock, int instances)
    : model_(std::move(model)), scheduler_(std::move(scheduler)), clock_(clock) {
  for (int i = 0; i < instances; ++i) threads_.emplace_back([this] { Loop(); });
}

ModelRunner::~ModelRunner() { Stop(); }

absl::Status ModelRunner::Enqueue(std::shared_ptr<RunnableRequest> request) {
  MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the model is shutting down");
  absl::Status s = scheduler_->Enqueue(std::move(request));
  if (s.ok()) work_.SignalAll();
  return s;
}

void ModelRunner::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ModelRunner::Loop() {
  DeviceStreamScope stream(model_->torch_device());
  while (true) {
    std::vector<QueuedText> batch;
    {
      MutexLock lock(&mu_);
      while (true) {
        batch = scheduler_->TakeBatch(/*drain=*/stopping_);
        if (!batch.empty()) break;
        if (stopping_ && scheduler_->queued_texts() == 0) return;
        // Sleep until the oldest text is due or new work arrives. The deadline is in real time: with a
        // fake clock, tests call TakeBatch themselves instead of running this loop.
        const absl::Time due = scheduler_->NextDue();
        const absl::Duration wait = due == absl::InfiniteFuture() ? absl::InfiniteDuration() : due - clock_->Now();
        work_.WaitWithTimeout(&mu_, std::max(wait, absl::ZeroDuration()));
      }
    }
    Run(batch);
  }
}

void ModelRunner::Run(std::vector<QueuedText>& batch) const {
  const int64_t rows = static_cast<int64_t>(batch.size());
  int64_t width = 1;
  std::set<std::string> wanted;
  for (const QueuedText& t : batch) {
    const auto& r = static_cast<const RunnableRequest&>(*t.request);
    width = std::max<int64_t>(width, static_cast<int64_t>(r.ids(t.index).size()));
    wanted.insert(r.wanted().begin(), r.wanted().end());
  }
  torch::Tensor ids = torch::zeros({rows, width}, torch::kLong);
  torch::Tensor mask = torch::zeros({rows, width}, torch::kBool);
  auto id = ids.accessor<int64_t, 2>();
  auto mk = mask.accessor<bool, 2>();
  for (int64_t b = 0; b < rows; ++b) {
    const auto& tokens = static_cast<const RunnableRequest&>(*batch[b].request).ids(batch[b].index);
    for (size_t t = 0; t < tokens.size(); ++t) {
      id[b][t] = tokens[t];
      mk[b][t] = true;
    }
  }
  absl::StatusOr<ModelOutputs> out = model_->Forward(ids, mask, std::vector<std::string>(wanted.begin(), wanted.end()));
  const absl::Status status = out.status();
  for (int64_t b = 0; b < rows; ++b) {
    const auto& r = static_cast<const RunnableRequest&>(*batch[b].request);
    absl::Status row_status = status;
    if (row_status.ok()) {
      try {
        row_status = r.HandleRow(batch[b].index, *out, b);
      } catch (const std::exception& e) {  // torch errors the output checks did not foresee
        row_status = absl::InternalError(absl::StrCat("post-processing failed: ", e.what()));
      }
    }
    batch[b].request->Complete(batch[b].index, row_status);
  }
}

}  // namespace qvi
