// InferStream's reactions and steps (infer_stream.h, which includes this file at its end; include that one).
#ifndef QVI_SERVER_GRPC_INFER_STREAM_INL_H_
#define QVI_SERVER_GRPC_INFER_STREAM_INL_H_

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc/infer_stream.h"

namespace qvi {

template <typename StreamResponse>
InferStream<StreamResponse>::InferStream(Options options, grpc::CallbackServerContext* ctx)
    : options_(std::move(options)), ctx_(ctx) {
  // The stream is refused as a whole for its key or its metadata; each request is admitted again.
  absl::Status refused;
  const absl::string_view authorization = Authorization(ctx, *options_.calls);
  if (authorization == kOversizedMetadata) {
    refused = options_.calls->Authorize(authorization, Scope::kInfer, nullptr, /*count_refusal=*/false);
  } else if (const ApiKeys* keys = options_.calls->options().api_keys; keys != nullptr) {
    refused = keys->Authorize(authorization, Scope::kInfer).status();
  }
  if (!refused.ok()) {
    {
      MutexLock lock(&mu_);
      finished_ = true;
      read_closed_ = true;
    }
    FinishOnce(ToGrpcStatus(refused));
    return;
  }
  Step step;
  {
    MutexLock lock(&mu_);
    step = NextLocked();
  }
  Take(step);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::OnReadDone(bool ok) {
  if (!ok) {  // the client half-closed, or the stream is over
    Step step;
    {
      MutexLock lock(&mu_);
      reading_ = false;
      read_closed_ = true;
      step = NextLocked();
    }
    return Take(step);
  }
  {
    MutexLock lock(&mu_);
    if (finished_) {  // kInOrder: the stream ended while this read was outstanding; its message is not answered
      reading_ = false;
      return;
    }
  }
  const int64_t index = next_index_++;
  auto* item = new Item(this, index, &read_);
  {
    MutexLock lock(&mu_);
    ++inflight_;
  }
  // The item may be answered (Deliver), even written, before this returns: a refusal, or a core that
  // answers at once. `reading_` stays set until the end, so the stream cannot finish (nor be deleted)
  // under this reaction.
  if (absl::Status admitted = item->call().Admission(Authorization(ctx_, *options_.calls)); !admitted.ok()) {
    item->Answer(admitted);
  } else if (options_.answer) {
    absl::Status answered;
    try {
      answered = options_.answer(*item->request(), &item->call(), item->deadline(), item->response());
    } catch (...) {
      answered = absl::InternalError(absl::StrCat("answering failed: ", CurrentExceptionText()));
    }
    item->Answer(answered);
  } else {
    // The stream's plan by address, not copied per message: the stream outlives every item it took
    // (it is deleted only when none is in flight), and an item is planned before it is answered.
    auto plan =
        std::make_shared<std::function<absl::StatusOr<PlannedCall<StreamResponse>>(const grpc::ByteBuffer&, Call*)>>(
            [plan = &options_.plan, index](const grpc::ByteBuffer& bytes, Call* call) {
              return (*plan)(bytes, call, index);
            });
    PlanInferCall<StreamResponse>(item, options_.core, item->request(), item->response(), std::move(plan));
  }
  Step step;
  {
    MutexLock lock(&mu_);
    reading_ = false;
    step = NextLocked();
  }
  Take(step);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::Deliver(Item* item) {
  bool writable;
  Step step;
  {
    MutexLock lock(&mu_);
    writable = !finished_ && !cancelled_.load();
    if (writable) {
      if constexpr (kInOrder) {
        early_.emplace(item->index(), item);
        for (auto next = early_.find(next_write_); next != early_.end(); next = early_.find(++next_write_)) {
          ready_.push_back(next->second);
          early_.erase(next);
        }
      } else {
        ready_.push_back(item);
      }
      step = NextLocked();
    }
  }
  if (!writable) return Retire(item, /*written=*/false);
  Take(step);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::OnWriteDone(bool ok) {
  Item* written;
  std::deque<Item*> unsent;
  {
    MutexLock lock(&mu_);
    written = writing_;
    writing_ = nullptr;
    if (!ok) {  // the stream is broken: nothing more can be written
      cancelled_.store(true);
      unsent = TakeUnsentLocked();
    }
  }
  // `written` still counts in flight, so the stream outlives these; its own Retire comes last.
  for (Item* item : unsent) Retire(item, /*written=*/false);
  Retire(written, ok);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::OnCancel() {
  cancelled_.store(true);
  std::deque<Item*> unsent;
  Step step;
  {
    MutexLock lock(&mu_);
    unsent = TakeUnsentLocked();
    step = NextLocked();
  }
  Take(step);  // may finish; the unsent items still count in flight, so the stream outlives the loop
  for (Item* item : unsent) Retire(item, /*written=*/false);
}

template <typename StreamResponse>
std::deque<typename InferStream<StreamResponse>::Item*> InferStream<StreamResponse>::TakeUnsentLocked() {
  std::deque<Item*> unsent;
  unsent.swap(ready_);
  for (const auto& [index, item] : early_) unsent.push_back(item);
  early_.clear();
  return unsent;
}

template <typename StreamResponse>
typename InferStream<StreamResponse>::Step InferStream<StreamResponse>::NextLocked() {
  Step step;
  if (finished_) return step;
  const bool cancelled = cancelled_.load();
  if (writing_ == nullptr && !ready_.empty() && !cancelled) {
    if (kInOrder && !ready_.front()->status().ok()) {
      // Its turn has come: its status ends the stream, even with a read outstanding (which then completes,
      // and whose message is dropped). The requests still in the core see the stream cancelled and are
      // retired as they come back.
      step.failed = ready_.front();
      ready_.pop_front();
      step.unsent = TakeUnsentLocked();
      cancelled_.store(true);
      finished_ = true;
      step.finish = true;
      return step;
    }
    writing_ = ready_.front();
    ready_.pop_front();
    step.write = writing_->response();
  }
  if (!reading_ && !read_closed_ && !cancelled && inflight_ < options_.max_inflight) {
    reading_ = true;
    step.read = true;
  }
  // The end: the client sent everything and has every answer; or the stream was cancelled, and the
  // requests still in the core are retired as they come back.
  if (!reading_ && (read_closed_ || cancelled) && writing_ == nullptr && (inflight_ == 0 || cancelled)) {
    finished_ = true;
    step.finish = true;
  }
  return step;
}

template <typename StreamResponse>
void InferStream<StreamResponse>::FinishOnce(const grpc::Status& status) {
  {
    MutexLock lock(&start_mu_);
    finish_called_ = true;
  }
  // Last: once it is called, OnDone may run and delete the stream. A read started before the flag was set
  // was started before this Finish; none starts after it.
  Finish(status);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::Take(const Step& step) {
  if (step.write != nullptr) StartWrite(step.write);
  if (step.read) {
    // gRPC never runs OnReadDone inline from StartRead, so holding start_mu_ here cannot deadlock.
    MutexLock lock(&start_mu_);
    if (!finish_called_) StartRead(&read_);
  }
  if (step.failed != nullptr) {
    // A refusal for a rate limit says when to retry, as a unary call's does.
    AddRetryPushback(ctx_, step.failed->status());
    FinishOnce(ToGrpcStatus(step.failed->status()));
    // Each retired request still counts in flight until its Retire: the stream outlives these.
    for (Item* item : step.unsent) Retire(item, /*written=*/false);
    Retire(step.failed, /*written=*/true);
    return;
  }
  if (step.finish) FinishOnce(cancelled_.load() ? grpc::Status::CANCELLED : grpc::Status::OK);
}

template <typename StreamResponse>
void InferStream<StreamResponse>::Retire(Item* item, bool written) {
  item->Record(written);
  delete item;
  Step step;
  bool last;
  {
    MutexLock lock(&mu_);
    --inflight_;
    step = NextLocked();
    last = done_ && inflight_ == 0;
  }
  Take(step);
  if (last) delete this;
}

template <typename StreamResponse>
void InferStream<StreamResponse>::OnDone() {
  bool last;
  {
    MutexLock lock(&mu_);
    done_ = true;
    last = inflight_ == 0;
  }
  if (last) delete this;
}

}  // namespace qvi

#endif  // QVI_SERVER_GRPC_INFER_STREAM_INL_H_
