// The Prometheus metrics as a scrape sees them: names, labels, buckets, and the life of a model
// version's series. Fed by hand, read back with Serialize() (no port; threads only where a test
// needs some to block, to count the process's context switches).
#include "server/metrics/metrics.h"
#include "server/core/alloc/allocator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <thread>

namespace qvi {
namespace {

// The value of the one sample line that starts with `series` (name and labels), or -1.
double Sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

TEST(MetricsTest, RequestsAreCountedByModelVersionMethodAndCode) {
  Metrics m;
  m.OnRequestStart();
  m.OnRequestStart();
  EXPECT_EQ(Sample(m.Serialize(), "qvi_requests_in_flight"), 2);
  m.OnRequestDone("Classify", "sentiment", 1, "OK", absl::Microseconds(300));
  m.OnRequestDone("Classify", "_unknown", 0, "NOT_FOUND", absl::Seconds(3));
  const std::string text = m.Serialize();
  EXPECT_EQ(Sample(text, "qvi_requests_in_flight"), 0);
  EXPECT_EQ(Sample(text, R"(qvi_requests_total{code="OK",method="Classify",model="sentiment",version="1"})"), 1);
  EXPECT_EQ(Sample(text, R"(qvi_requests_total{code="NOT_FOUND",method="Classify",model="_unknown",version="0"})"), 1);
  // Sub-millisecond and multi-second latencies land in different buckets.
  EXPECT_EQ(
      Sample(text,
             R"(qvi_request_duration_seconds_bucket{method="Classify",model="sentiment",version="1",le="0.0002"})"),
      0);
  EXPECT_EQ(
      Sample(text,
             R"(qvi_request_duration_seconds_bucket{method="Classify",model="sentiment",version="1",le="0.0005"})"),
      1);
  EXPECT_EQ(
      Sample(text, R"(qvi_request_duration_seconds_bucket{method="Classify",model="_unknown",version="0",le="2"})"), 0);
  EXPECT_EQ(
      Sample(text, R"(qvi_request_duration_seconds_bucket{method="Classify",model="_unknown",version="0",le="5"})"), 1);
  EXPECT_NE(text.find("# TYPE qvi_requests_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE qvi_request_duration_seconds histogram"), std::string::npos);
}

TEST(MetricsTest, TheProcessReportsItsCpuMemoryThreadsAndDescriptors) {
  Metrics m;
  // Some CPU to count: the counter must move between two scrapes.
  const double before = Sample(m.Serialize(), "process_cpu_seconds_total");
  volatile double sink = 0;
  for (int i = 0; i < 20000000; ++i) sink = sink + i * 0.5;
  const std::string text = m.Serialize();
  EXPECT_GT(Sample(text, "process_cpu_seconds_total"), before);
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Sample(text, "process_threads"), 1);
  EXPECT_GE(Sample(text, "process_open_fds"), 3);  // stdin, stdout, stderr at least
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE process_resident_memory_bytes gauge"), std::string::npos);
}

TEST(MetricsTest, TheProcessCountsItsThreadsContextSwitches) {
  Metrics m;
  const std::string voluntary = R"(qvi_process_context_switches_total{kind="voluntary"})";
  const double before = Sample(m.Serialize(), voluntary);
  // A thread that blocks gives up its CPU: each join below waits for a thread that is still running.
  for (int i = 0; i < 20; ++i) {
    std::thread t([] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
    t.join();
  }
  const std::string text = m.Serialize();
  EXPECT_GE(Sample(text, voluntary), before + 20);
  EXPECT_GE(Sample(text, R"(qvi_process_context_switches_total{kind="involuntary"})"), 0);
  EXPECT_NE(text.find("# TYPE qvi_process_context_switches_total counter"), std::string::npos);
}

TEST(MetricsTest, MallocReportsBytesInUseAndFree) {
  Metrics m;
  // The series carry the allocator the process runs on (glibc's here; the jemalloc build of this
  // check is allocator_jemalloc_test).
  const std::string allocator = ReadAllocatorStats().allocator;
  const std::string in_use = "qvi_malloc_bytes{allocator=\"" + allocator + "\",state=\"in_use\"}";
  const std::string free = "qvi_malloc_bytes{allocator=\"" + allocator + "\",state=\"free\"}";
  const double before = Sample(m.Serialize(), in_use);
  // 64 MiB held across the scrape (written, so that it is really allocated) must show as in use.
  std::vector<char> held(64 << 20, 1);
  const std::string text = m.Serialize();
  EXPECT_GE(Sample(text, in_use), before + (64 << 20));
  EXPECT_GE(Sample(text, free), 0);
  EXPECT_NE(text.find("# TYPE qvi_malloc_bytes gauge"), std::string::npos);
  EXPECT_EQ(held[12345], 1);
}

TEST(MetricsTest, AScrapedCounterIsReadAtEachScrape) {
  Metrics m;
  double dropped = 0;
  m.AddScrapedCounter("qvi_access_log_dropped_lines_total", "dropped lines", [&dropped] { return dropped; });
  EXPECT_EQ(Sample(m.Serialize(), "qvi_access_log_dropped_lines_total"), 0);
  dropped = 7;
  const std::string text = m.Serialize();
  EXPECT_EQ(Sample(text, "qvi_access_log_dropped_lines_total"), 7);
  EXPECT_NE(text.find("# TYPE qvi_access_log_dropped_lines_total counter"), std::string::npos);
}

TEST(MetricsTest, FilesChangedInPlaceAreCountedByModelAndResult) {
  Metrics m;
  m.OnModelFilesChanged("sentiment", true);
  m.OnModelFilesChanged("sentiment", false);
  m.OnModelFilesChanged("sentiment", false);
  const std::string text = m.Serialize();
  EXPECT_EQ(Sample(text, R"(qvi_model_file_changes_total{model="sentiment",result="reloaded"})"), 1);
  EXPECT_EQ(Sample(text, R"(qvi_model_file_changes_total{model="sentiment",result="failed"})"), 2);
}

TEST(MetricsTest, BatchesReportSizeTokensPaddingQueueAndCompute) {
  Metrics m;
  BatchReport b;
  b.texts = 4;
  b.tokens = 24;
  b.padded_tokens = 32;  // 4 texts x 8: a quarter is padding
  b.compute = absl::Milliseconds(3);
  b.device = absl::Microseconds(1500);  // an emulated device's time (null_model.h)
  b.queue_waits = {absl::Microseconds(150), absl::Microseconds(150), absl::Milliseconds(1), absl::Milliseconds(2)};
  m.OnBatch("sentiment", 2, b);
  b.ok = false;
  b.device = absl::ZeroDuration();  // a backend that does not know it adds nothing
  m.OnBatch("sentiment", 2, b);
  m.OnQueueDepth("sentiment", 2, 7);
  const std::string t = m.Serialize();
  const std::string v = R"(model="sentiment",version="2")";
  EXPECT_EQ(Sample(t, "qvi_batch_size_count{" + v + "}"), 2);
  EXPECT_EQ(Sample(t, "qvi_batch_size_sum{" + v + "}"), 8);
  EXPECT_EQ(Sample(t, "qvi_batch_tokens_sum{" + v + "}"), 64);
  EXPECT_DOUBLE_EQ(Sample(t, "qvi_batch_padding_ratio_sum{" + v + "}"), 0.5);
  EXPECT_EQ(Sample(t, "qvi_queue_duration_seconds_count{" + v + "}"), 8);
  EXPECT_EQ(Sample(t, "qvi_queue_duration_seconds_bucket{" + v + R"(,le="0.0002"})"), 4);
  EXPECT_EQ(Sample(t, "qvi_compute_duration_seconds_bucket{" + v + R"(,le="0.005"})"), 2);
  EXPECT_EQ(Sample(t, "qvi_batch_failures_total{" + v + "}"), 1);
  EXPECT_DOUBLE_EQ(Sample(t, "qvi_device_busy_seconds_total{" + v + "}"), 0.0015);
  EXPECT_EQ(Sample(t, "qvi_queue_texts{" + v + "}"), 7);
  EXPECT_EQ(Sample(t, "qvi_tokens_total{" + v + "}"), 24) << "the batch that ran; not its padding, not the failed one";
}

TEST(MetricsTest, AnswersAreSizedAndTimedByTheExplanationsAskedFor) {
  Metrics m;
  m.OnAnswer("sentiment", "none", 300, absl::Microseconds(40));
  m.OnAnswer("sentiment", "attention+gates", 5000, absl::Microseconds(300));
  m.OnAnswer("sentiment", "attention+gates", 7000, absl::Milliseconds(3));
  const std::string t = m.Serialize();
  const std::string plain = R"(explain="none",model="sentiment")";
  const std::string explained = R"(explain="attention+gates",model="sentiment")";
  EXPECT_EQ(Sample(t, "qvi_answer_size_bytes_count{" + plain + "}"), 1);
  EXPECT_EQ(Sample(t, "qvi_answer_size_bytes_sum{" + explained + "}"), 12000);
  EXPECT_EQ(Sample(t, "qvi_answer_size_bytes_bucket{" + explained + R"(,le="4096"})"), 0);
  EXPECT_EQ(Sample(t, "qvi_answer_size_bytes_bucket{" + explained + R"(,le="8192"})"), 2);
  EXPECT_EQ(Sample(t, "qvi_answer_make_seconds_bucket{" + explained + R"(,le="0.0005"})"), 1);
  EXPECT_DOUBLE_EQ(Sample(t, "qvi_answer_make_seconds_sum{" + explained + "}"), 0.0033);
}

TEST(MetricsTest, ModelLoadsAndEvictionsAreCountedByReason) {
  Metrics m;
  m.OnModelMemoryEvent("topics", true, "poll");
  m.OnModelMemoryEvent("topics", false, "budget");
  m.OnModelMemoryEvent("topics", true, "demand");
  m.OnModelMemoryEvent("topics", false, "idle");
  m.OnModelMemoryEvent("topics", true, "demand");
  const std::string t = m.Serialize();
  EXPECT_EQ(Sample(t, R"(qvi_model_loads_total{model="topics",reason="poll"})"), 1);
  EXPECT_EQ(Sample(t, R"(qvi_model_loads_total{model="topics",reason="demand"})"), 2);
  EXPECT_EQ(Sample(t, R"(qvi_model_evictions_total{model="topics",reason="budget"})"), 1);
  EXPECT_EQ(Sample(t, R"(qvi_model_evictions_total{model="topics",reason="idle"})"), 1);
}

TEST(MetricsTest, AnswersReportTheirHandOffAndTheirTimePerShare) {
  Metrics m;
  AnswerReport a;
  a.texts = 16;
  a.wait = absl::Microseconds(150);
  a.run = absl::Microseconds(800);
  m.OnAnswers("sentiment", 2, a);
  a.wait = absl::Milliseconds(3);
  a.run = absl::Milliseconds(4);
  m.OnAnswers("sentiment", 2, a);
  const std::string t = m.Serialize();
  const std::string v = R"(model="sentiment",version="2")";
  EXPECT_EQ(Sample(t, "qvi_answer_wait_seconds_count{" + v + "}"), 2);
  EXPECT_EQ(Sample(t, "qvi_answer_wait_seconds_bucket{" + v + R"(,le="0.0002"})"), 1);
  EXPECT_DOUBLE_EQ(Sample(t, "qvi_answer_wait_seconds_sum{" + v + "}"), 0.00315);
  EXPECT_EQ(Sample(t, "qvi_answer_duration_seconds_bucket{" + v + R"(,le="0.001"})"), 1);
  EXPECT_DOUBLE_EQ(Sample(t, "qvi_answer_duration_seconds_sum{" + v + "}"), 0.0048);
}

TEST(MetricsTest, ModelStateFollowsTheLifecycleAndUnloadedSeriesGo) {
  Metrics m;
  m.OnModelEvent("ner", VersionStatus{3, ModelState::kLoading, "loading", nullptr, {}});
  EXPECT_EQ(Sample(m.Serialize(), R"(qvi_model_state{model="ner",state="loading",version="3"})"), 1);
  m.OnModelEvent("ner", VersionStatus{3, ModelState::kFailed, "corrupt", nullptr, {}});
  std::string t = m.Serialize();
  EXPECT_EQ(Sample(t, R"(qvi_model_state{model="ner",state="loading",version="3"})"), -1) << "one state at a time";
  EXPECT_EQ(Sample(t, R"(qvi_model_state{model="ner",state="failed",version="3"})"), 1);

  m.OnModelEvent("ner", VersionStatus{2, ModelState::kReady, "", nullptr, {}});
  m.OnQueueDepth("ner", 2, 1);
  BatchReport batch;
  batch.texts = 1;
  batch.tokens = 5;
  m.OnBatch("ner", 2, batch);  // qvi_tokens_total among its series
  m.OnAnswers("ner", 2, AnswerReport{1, absl::ZeroDuration(), absl::Microseconds(10)});
  m.OnRequestStart();
  m.OnRequestDone("Tag", "ner", 2, "OK", absl::Milliseconds(3));
  m.OnRequestStart();
  m.OnRequestDone("Tag", "ner", 3, "UNAVAILABLE", absl::Milliseconds(1));
  m.OnModelEvent("ner", VersionStatus{2, ModelState::kUnloading, "replaced", nullptr, {}});
  m.OnModelEvent("ner", VersionStatus{2, ModelState::kUnloaded, "unloaded", nullptr, {}});
  t = m.Serialize();
  EXPECT_EQ(t.find(R"(version="2")"), std::string::npos) << "an unloaded version leaves no series:\n" << t;
  EXPECT_EQ(Sample(t, R"(qvi_model_state{model="ner",state="failed",version="3"})"), 1);
  EXPECT_EQ(Sample(t, R"(qvi_requests_total{code="UNAVAILABLE",method="Tag",model="ner",version="3"})"), 1)
      << "other versions keep their series";
}

TEST(MetricsTest, ServesTheTextFormatOverHttp) {
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Serve("127.0.0.1", 0);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT((*m)->port(), 0);
  // The HTTP side is exercised end to end by tests/python/test_observability.py (a real Prometheus).
}

}  // namespace
}  // namespace qvi
