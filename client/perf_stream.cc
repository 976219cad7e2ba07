#include "client/perf_stream.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace qvi::perf {

namespace v1 = ::qvi::serving::v1;

namespace {

template <typename Request, typename Response>
class OneStream {
 public:
  OneStream(v1::Inference::Stub& stub, const std::vector<Request>& requests, size_t offset, int credit,
            const std::string& api_key, Recorder* rec, Clock::time_point end)
      : requests_(requests), offset_(offset), credit_(credit), rec_(rec), end_(end) {
    if (!api_key.empty()) ctx_.AddMetadata("authorization", "Bearer " + api_key);
    stream_ = Open(stub);
    writer_ = std::thread([this] { WriteLoop(); });
    reader_ = std::thread([this] { ReadLoop(); });
  }
  ~OneStream() {
    writer_.join();
    reader_.join();
    (void)stream_->Finish();
  }

 private:
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> Open(v1::Inference::Stub& stub);

  void WriteLoop() {
    for (int64_t index = 0;; ++index) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!room_.wait_until(lock, end_, [&] { return credit_ > 0; })) break;  // the window is over
      --credit_;
      const Clock::time_point now = Clock::now();
      if (now >= end_) break;
      sent_at_[index] = now;
      lock.unlock();
      if (!stream_->Write(requests_[(offset_ + static_cast<size_t>(index)) % requests_.size()])) break;
    }
    stream_->WritesDone();
  }

  void ReadLoop() {
    Response answer;
    while (stream_->Read(&answer)) {
      const Clock::time_point now = Clock::now();
      Clock::time_point sent;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = sent_at_.find(answer.index());
        if (it == sent_at_.end()) continue;
        sent = it->second;
        sent_at_.erase(it);
        ++credit_;
      }
      room_.notify_one();
      rec_->Record(
          sent, now,
          answer.has_error() ? absl::StatusCodeToString(static_cast<absl::StatusCode>(answer.error().code())) : "");
    }
  }

  const std::vector<Request>& requests_;
  const size_t offset_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> stream_;
  std::mutex mu_;
  std::condition_variable room_;
  int credit_;
  std::map<int64_t, Clock::time_point> sent_at_;
  Recorder* const rec_;
  const Clock::time_point end_;
  std::thread writer_, reader_;
};

template <>
std::unique_ptr<grpc::ClientReaderWriter<v1::ClassifyRequest, v1::ClassifyStreamResponse>>
OneStream<v1::ClassifyRequest, v1::ClassifyStreamResponse>::Open(v1::Inference::Stub& stub) {
  return stub.ClassifyStream(&ctx_);
}

template <>
std::unique_ptr<grpc::ClientReaderWriter<v1::TagRequest, v1::TagStreamResponse>>
OneStream<v1::TagRequest, v1::TagStreamResponse>::Open(v1::Inference::Stub& stub) {
  return stub.TagStream(&ctx_);
}

template <typename Request, typename Response>
void RunStreams(const StreamLoad& load, const std::vector<Request>& requests, int concurrency, Recorder* rec,
                Clock::time_point end) {
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs;
  std::vector<std::unique_ptr<OneStream<Request, Response>>> streams;
  const int n = std::max(1, std::min(concurrency, static_cast<int>(load.channels.size())));
  for (int i = 0; i < n; ++i) {
    stubs.push_back(v1::Inference::NewStub(load.channels[i]));
    const int credit = concurrency / n + (i < concurrency % n ? 1 : 0);
    streams.push_back(std::make_unique<OneStream<Request, Response>>(*stubs.back(), requests, requests.size() * i / n,
                                                                     credit, load.api_key, rec, end));
  }
  streams.clear();  // joins each stream's threads once its window is over and its answers are in
}

}  // namespace

Step ClosedLoopStream(const StreamLoad& load, int concurrency, double warmup, double duration) {
  const auto start = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warmup));
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
  Recorder rec(start, end);
  if (load.tag_method) {
    RunStreams<v1::TagRequest, v1::TagStreamResponse>(load, *load.tag, concurrency, &rec, end);
  } else {
    RunStreams<v1::ClassifyRequest, v1::ClassifyStreamResponse>(load, *load.classify, concurrency, &rec, end);
  }
  return rec.Take("stream", concurrency, duration);
}

}  // namespace qvi::perf
