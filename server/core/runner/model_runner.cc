#include "server/core/runner/model_runner.h"
#include "server/core/base/exception_text.h"

#include <ATen/core/Tensor.h>
#include <algorithm>
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace qvi {

BatchSchedulerOptions BatchingOptions(const ServingConfig& serving) {
  BatchSchedulerOptions o;
  o.max_batch_size = serving.max_batch_size;
  o.max_batch_tokens = serving.max_batch_tokens;
  o.max_queue_delay = absl::Microseconds(static_cast<int64_t>(serving.max_queue_delay_ms * 1000));
  o.priority_aging = absl::Microseconds(static_cast<int64_t>(serving.priority_aging_ms * 1000));
  o.max_queued_texts = serving.max_queued_texts;
  o.max_queued_tokens = serving.max_queued_tokens;
  return o;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(std::shared_ptr<const Model> model, int64_t version,
                                                                 const ServingConfig& serving, const Env* env,
                                                                 ServingObserver* observer, Executor* answers,
                                                                 bool pipeline) {
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler = Scheduler::Create(BatchingOptions(serving), env);
  if (!scheduler.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid batching settings: ", scheduler.status().message()));
  }
  return std::make_unique<ModelRunner>(std::move(model), version, *std::move(scheduler), env, serving.instances,
                                       observer, serving.batching, answers, pipeline);
}

ModelRunner::ModelRunner(std::shared_ptr<const Model> model, int64_t version, std::unique_ptr<Scheduler> scheduler,
                         const Env* env, int instances, ServingObserver* observer, BatchingMode batching,
                         Executor* answers, bool pipeline)
    : model_(std::move(model)),
      version_(version),
      scheduler_(std::move(scheduler)),
      observer_(observer),
      batching_(batching),
      env_(env),
      answers_(answers),
      pipelined_(pipeline && model_->asynchronous()),
      max_answering_(2 * std::max(instances, 1)) {
  for (int i = 0; i < instances; ++i) threads_.push_back(env_->StartThread("qvi-instance", [this] { Loop(); }));
}

ModelRunner::~ModelRunner() { Stop(); }

absl::Status ModelRunner::Enqueue(std::shared_ptr<RunnableRequest> request) {
  Shed<RunnableRequest> shed;
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the model is shutting down");
    if (absl::Status s = scheduler_->Enqueue(request, &shed); !s.ok()) return s;
    ++work_seq_;
    // Every idle instance wakes, and the first to reach the queue takes the work: on a busy machine
    // the one whose core is free now. Waking one alone -- the longest asleep, or the last to fall
    // asleep -- costs fewer wake-ups but answered a lone request slower, twice measured with two
    // instances on two cores (docs/performance.md, "Tried and not kept": the woken one waits for its core).
    work_.SignalAll();
  }
  // Outside the lock, like every call out of the runner: the shed requests' answers, then the reports.
  shed.Fail();
  for (int level = 1; level <= kPriorityLevels; ++level) {
    if (shed.texts[level] == 0) continue;
    absl::Status s =
        Observe("OnShed", [&] { observer_->OnShed(model_->manifest().name, version_, level, shed.texts[level]); });
    if (!s.ok())
      spdlog::error("model '{}' version {}: {}", model_->manifest().name, version_, std::string(s.message()));
  }
  ReportQueueDepth();
  return absl::OkStatus();
}

absl::Status ModelRunner::Observe(const char* hook, const std::function<void()>& call) const {
  if (observer_ == nullptr) return absl::OkStatus();
  try {
    call();
    return absl::OkStatus();
  } catch (...) {
    return absl::InternalError(absl::StrCat("the serving observer's ", hook, " failed: ", CurrentExceptionText()));
  }
}

void ModelRunner::ReportQueueDepth() const {
  // The depth is the queue's, not a request's: a failure here is logged and fails nothing.
  MutexLock lock(&depth_mu_);
  absl::Status s = Observe(
      "OnQueueDepth", [&] { observer_->OnQueueDepth(model_->manifest().name, version_, scheduler_->queued_texts()); });
  if (!s.ok()) spdlog::error("model '{}' version {}: {}", model_->manifest().name, version_, std::string(s.message()));
}

void ModelRunner::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    ++work_seq_;
    work_.SignalAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  // The instance threads are gone; the answers of their last batches may still be on the pool.
  MutexLock lock(&answering_mu_);
  while (answering_ > 0) answered_.Wait(&answering_mu_);
}

void ModelRunner::Loop() {
  DeviceStreamScope stream(model_->torch_device());
  // Where the device computes on its own (a GPU), the next batch is launched before the last is
  // collected: the device works on it while this thread waits for the last one's outputs and hands
  // them out. At most one batch waits so.
  const bool pipelined = pipelined_;
  std::optional<InFlight> in_flight;
  while (true) {
    uint64_t seen = 0;
    Take when = Take::kWhenDue;
    {
      MutexLock lock(&mu_);
      seen = work_seq_;
      if (stopping_ || batching_ == BatchingMode::kWhenIdle) when = Take::kNow;
    }
    // Outside the runner's lock: forming a batch fails the expired and cancelled requests, and their
    // done-callbacks (serialising, logging, Finish) may take any time.
    Batch batch = scheduler_->TakeBatch(when);
    if (!batch.empty()) {
      ReportQueueDepth();
      std::optional<InFlight> launched;
      try {
        launched = Launch(batch);
      } catch (...) {  // bad_alloc packing the inputs, say: this batch fails, the thread serves on
        Fail(batch, "running the batch failed: ");
      }
      if (in_flight) Settle(std::exchange(in_flight, std::nullopt));
      if (launched && pipelined) {
        in_flight = std::move(launched);
      } else if (launched) {
        Settle(std::move(launched));
      }
      continue;
    }
    // Nothing due: the batch on the device is collected now rather than after a sleep.
    if (in_flight) {
      Settle(std::exchange(in_flight, std::nullopt));
      continue;
    }
    MutexLock lock(&mu_);
    if (stopping_ && scheduler_->queued_texts() == 0) return;
    // Work arrived (or Stop() came) since `seen`: take again at once rather than sleep through it.
    if (work_seq_ != seen) continue;
    // Sleep until the oldest text is due (on the environment's clock, so a fake one wakes it when a
    // test advances it) or new work arrives.
    env_->WaitUntil(&work_, &mu_, scheduler_->NextDue());
  }
}

void ModelRunner::Fail(Batch& batch, const char* what) {
  const absl::Status failed = absl::InternalError(absl::StrCat(what, CurrentExceptionText()));
  for (QueuedText<RunnableRequest>& t : batch) t.request->Complete(t.index, failed);
}

void ModelRunner::Settle(std::optional<InFlight> batch) {
  try {
    Run(*batch);
  } catch (...) {  // bad_alloc, say, before the texts were handed to the answers: they fail here
    Fail(batch->batch, "running the batch failed: ");
  }
}

ModelRunner::Wanted ModelRunner::MergeWanted(const Batch& batch) {
  OutputSet outputs;
  // The layers and heads any text of the batch wants: the union, or all when one wants all.
  bool all_layers = false, all_heads = false, any_layers = false;
  // Heads are averaged on the device when every text that wants per-layer outputs wants the same
  // heads averaged; otherwise the union of heads leaves the device and is averaged per request.
  bool mean_heads = true;
  const std::vector<int64_t>* first_heads = nullptr;
  std::set<int64_t> layers, heads;
  for (const QueuedText<RunnableRequest>& t : batch) {
    const RunnableRequest& r = *t.request;
    outputs |= r.wanted();
    if (!r.wants_layers()) continue;
    any_layers = true;
    all_layers = all_layers || r.selection().layers.empty();
    all_heads = all_heads || r.selection().heads.empty();
    mean_heads =
        mean_heads && r.selection().mean_heads && (first_heads == nullptr || *first_heads == r.selection().heads);
    if (first_heads == nullptr) first_heads = &r.selection().heads;
    layers.insert(r.selection().layers.begin(), r.selection().layers.end());
    heads.insert(r.selection().heads.begin(), r.selection().heads.end());
  }
  Wanted wanted;
  wanted.outputs = outputs;
  if (any_layers && !all_layers) wanted.selection.layers.assign(layers.begin(), layers.end());
  if (any_layers && !all_heads) wanted.selection.heads.assign(heads.begin(), heads.end());
  wanted.selection.mean_heads = any_layers && mean_heads;
  return wanted;
}

PackedBatch ModelRunner::Pack(const Batch& batch) {
  std::vector<const std::vector<int64_t>*> texts;
  texts.reserve(batch.size());
  for (const QueuedText<RunnableRequest>& t : batch) texts.push_back(&t.request->ids(t.index));
  return PackTokenIds(texts);
}

void ModelRunner::DeliverRows(const Batch& batch, const ModelOutputs& outputs, size_t begin, size_t end,
                              std::vector<absl::Status>& statuses) {
  for (size_t b = begin; b < end; ++b) {
    if (!statuses[b].ok()) continue;
    try {
      statuses[b] = batch[b].request->HandleRow(batch[b].index, outputs, static_cast<int64_t>(b));
    } catch (...) {  // torch errors the output checks did not foresee, bad_alloc
      statuses[b] = absl::InternalError(absl::StrCat("post-processing failed: ", CurrentExceptionText()));
    }
  }
}

absl::Status ModelRunner::Report(const Batch& batch, const PackedBatch& packed, absl::Time start,
                                 absl::Time forward_end, absl::Duration device, bool ok) const {
  if (observer_ == nullptr) return absl::OkStatus();
  BatchReport report;
  report.texts = static_cast<int>(batch.size());
  report.tokens = packed.tokens;
  report.padded_tokens = packed.ids.numel();
  report.compute = forward_end - start;
  report.device = device;
  report.ok = ok;
  report.queue_waits.reserve(batch.size());
  for (const QueuedText<RunnableRequest>& t : batch) {
    report.queue_waits.push_back(start - t.arrival);
    // A request's texts may sit side by side in a batch: its span is linked once.
    if (const std::optional<SpanRef>& span = t.request->span();
        span && (report.spans.empty() || report.spans.back().span_id != span->span_id)) {
      report.spans.push_back(*span);
    }
  }
  if (!report.spans.empty()) report.start_wall = absl::Now() - (env_->Now() - start);
  return Observe("OnBatch", [&] { observer_->OnBatch(model_->manifest().name, version_, report); });
}

absl::Status ModelRunner::RunChecks(const Batch& batch, ModelOutputs& outputs) const {
  outputs.check_row.assign(batch.size(), -1);
  outputs.check_removed.assign(batch.size(), {});
  std::vector<std::vector<int64_t>> texts;
  at::Tensor alpha;
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!batch[b].request->Checks(batch[b].index)) continue;
    const int k = batch[b].request->faithfulness_top_k();
    if (!alpha.defined()) alpha = outputs.at(Output::kAttention).to(at::kCPU, at::kFloat);
    const std::vector<int64_t>& ids = batch[b].request->ids(batch[b].index);
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<int64_t>& removed = outputs.check_removed[b];
    if (const int64_t take = std::min<int64_t>(k, n); take > 0) {
      const at::Tensor top = std::get<1>(alpha[static_cast<int64_t>(b)].slice(0, 0, n).topk(take)).contiguous();
      removed.assign(top.data_ptr<int64_t>(), top.data_ptr<int64_t>() + take);
      std::sort(removed.begin(), removed.end());
    }
    std::vector<int64_t> kept;
    kept.reserve(static_cast<size_t>(n) - removed.size());
    for (int64_t i = 0, r = 0; i < n; ++i) {
      if (r < static_cast<int64_t>(removed.size()) && removed[static_cast<size_t>(r)] == i) {
        ++r;
      } else {
        kept.push_back(ids[static_cast<size_t>(i)]);
      }
    }
    outputs.check_row[b] = static_cast<int64_t>(texts.size());
    texts.push_back(std::move(kept));
  }
  if (texts.empty()) return absl::OkStatus();
  std::vector<const std::vector<int64_t>*> rows;
  for (const std::vector<int64_t>& t : texts) rows.push_back(&t);
  const PackedBatch packed = PackTokenIds(rows);
  OutputSet logits;
  logits.set(static_cast<size_t>(Output::kLogits));
  absl::StatusOr<ModelOutputs> again = model_->Forward(packed.ids, packed.mask, logits, OutputSelection{});
  if (!again.ok()) return again.status();
  outputs.check_logits = again->at(Output::kLogits);
  outputs.device_time += again->device_time;
  return absl::OkStatus();
}

struct ModelRunner::Answering {
  Batch batch;
  absl::StatusOr<ModelOutputs> outputs;
  std::vector<absl::Status> statuses;  // each text's, until its row is made; chunks touch their own
  absl::Time start, forward_end;
  std::atomic<int> chunks_left{0};
};

std::optional<ModelRunner::InFlight> ModelRunner::Launch(Batch& batch) const {
  const absl::Time start = env_->Now();
  const Wanted wanted = MergeWanted(batch);
  PackedBatch packed = Pack(batch);
  absl::StatusOr<LaunchedForward> launched = model_->Launch(packed.ids, packed.mask, wanted.outputs, wanted.selection);
  // Nothing throws from here: the batch moves only now, so that an exception above leaves it to Loop.
  return InFlight{std::move(batch), start, std::move(packed), std::move(launched)};
}

void ModelRunner::Run(InFlight& flight) {
  Batch& batch = flight.batch;
  const absl::Time start = flight.start;
  const PackedBatch& packed = flight.packed;
  absl::StatusOr<ModelOutputs> out =
      flight.launched.ok() ? model_->Collect(*std::move(flight.launched)) : flight.launched.status();
  absl::Status checks;
  if (out.ok()) {
    try {
      checks = RunChecks(batch, *out);
    } catch (...) {  // torch errors the model's own checks did not foresee
      checks = absl::InternalError(absl::StrCat("the faithfulness check failed: ", CurrentExceptionText()));
    }
  }
  const absl::Time forward_end = env_->Now();
  std::vector<absl::Status> statuses(batch.size(), out.ok() ? absl::OkStatus() : out.status());
  for (size_t b = 0; b < batch.size() && !checks.ok(); ++b) {
    if (batch[b].request->Checks(batch[b].index)) statuses[b] = checks;
  }
  const absl::Duration device = out.ok() ? out->device_time : absl::ZeroDuration();
  if (absl::Status s = Report(batch, packed, start, forward_end, device, out.ok()); !s.ok()) {
    statuses.assign(batch.size(), s);
  }
  const int chunks = ChunksFor(batch.size());
  auto a = std::make_shared<Answering>();
  a->outputs = std::move(out);
  a->statuses = std::move(statuses);
  a->start = start;
  a->forward_end = forward_end;
  if (chunks == 0) {
    a->batch = std::move(batch);
    Answer(*a, 0, a->batch.size());
    return;
  }
  BeginAnswering();
  // From here nothing throws before every text is in a chunk: the batch moves into `a` only now, so
  // that an exception above (bad_alloc) leaves it to Loop, which fails its texts.
  a->batch = std::move(batch);
  const size_t rows = a->batch.size();
  a->chunks_left.store(chunks, std::memory_order_relaxed);
  for (int c = 0; c < chunks; ++c) {
    const size_t begin = rows * static_cast<size_t>(c) / static_cast<size_t>(chunks);
    const size_t end = rows * static_cast<size_t>(c + 1) / static_cast<size_t>(chunks);
    auto chunk = [this, a, begin, end] {
      struct Counted {  // the last chunk lets the batch go, whatever happens in Answer
        ModelRunner* runner;
        Answering* a;
        ~Counted() {
          if (a->chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) runner->EndAnswering();
        }
      } counted{this, a.get()};
      Answer(*a, begin, end);
    };
    try {
      answers_->Submit(chunk);
    } catch (...) {  // bad_alloc queueing it: this thread makes these answers itself
      chunk();
    }
  }
}

int ModelRunner::ChunksFor(size_t rows) const {
  if (answers_ == nullptr || answers_->threads() == 0) return 0;
  const int64_t by_rows = (static_cast<int64_t>(rows) + kMinChunkRows - 1) / kMinChunkRows;
  // One chunk and nothing queued: the instance thread would only wait for work, so it answers.
  if (by_rows <= 1 && scheduler_->queued_texts() == 0) return 0;
  return static_cast<int>(std::clamp<int64_t>(by_rows, 1, answers_->threads()));
}

void ModelRunner::BeginAnswering() {
  MutexLock lock(&answering_mu_);
  while (answering_ >= max_answering_) answered_.Wait(&answering_mu_);
  ++answering_;
}

void ModelRunner::EndAnswering() {
  MutexLock lock(&answering_mu_);
  --answering_;
  answered_.SignalAll();
}

void ModelRunner::Answer(Answering& a, size_t begin, size_t end) const {
  const absl::Time begun = env_->Now();
  if (a.outputs.ok()) DeliverRows(a.batch, *a.outputs, begin, end, a.statuses);
  const absl::Time made = env_->Now();
  for (size_t b = begin; b < end; ++b) {
    const QueuedText<RunnableRequest>& t = a.batch[b];
    t.request->RecordTiming(t.arrival, a.start - t.arrival, a.forward_end - a.start, made - a.forward_end);
  }
  for (size_t b = begin; b < end; ++b) a.batch[b].request->Complete(a.batch[b].index, a.statuses[b]);
  // After the completions, which it measures: an observer that throws can fail nothing now.
  AnswerReport report;
  report.texts = static_cast<int>(end - begin);
  report.wait = begun - a.forward_end;
  report.run = env_->Now() - begun;
  absl::Status s = Observe("OnAnswers", [&] { observer_->OnAnswers(model_->manifest().name, version_, report); });
  if (!s.ok()) spdlog::error("model '{}' version {}: {}", model_->manifest().name, version_, std::string(s.message()));
}

}  // namespace qvi
