// The OTLP/HTTP span exporter against a collector in process (cpp-httplib on port 0) that decodes
// what it is sent with the vendored opentelemetry-proto messages: ids, names, times, attributes,
// links, status and resource arrive as they were made; a full queue drops and counts; a collector that
// is down or slow fails its batch, counted, while Export() never waits for it. Ids, sampling and the
// batch span beside.
#include "server/tracing/otlp_exporter.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "opentelemetry/proto/collector/logs/v1/logs_service.pb.h"
#include "opentelemetry/proto/collector/trace/v1/trace_service.pb.h"
#include "server/core/base/sync.h"
#include "server/tracing/tracing_observer.h"

namespace qvi {
namespace {

namespace otlp = ::opentelemetry::proto;

// A collector on 127.0.0.1:<port>: keeps every request it is sent, decoded; may be told to hold
// each POST until released.
class Collector {
 public:
  Collector() {
    server_.Post("/v1/traces", [this](const httplib::Request& req, httplib::Response& res) {
      if (holding_) released_.WaitForNotification();
      otlp::collector::trace::v1::ExportTraceServiceRequest r;
      if (req.get_header_value("Content-Type") != "application/x-protobuf" || !r.ParseFromString(req.body)) {
        res.status = 400;
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(std::move(r));
      res.status = 200;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~Collector() {
    released_.Notify();
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Hold() { holding_ = true; }
  void Release() { released_.Notify(); }
  std::vector<otlp::trace::v1::Span> spans() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<otlp::trace::v1::Span> out;
    for (const auto& r : requests_) {
      for (const auto& rs : r.resource_spans()) {
        for (const auto& ss : rs.scope_spans()) out.insert(out.end(), ss.spans().begin(), ss.spans().end());
      }
    }
    return out;
  }
  otlp::collector::trace::v1::ExportTraceServiceRequest first() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.at(0);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> holding_{false};
  Notification released_;
  std::mutex mu_;
  std::vector<otlp::collector::trace::v1::ExportTraceServiceRequest> requests_;
};

// Counts what the exporter reports, by outcome.
struct Counts {
  std::mutex mu;
  std::map<std::string, int64_t> by;
  OtlpExporter::Counter counter() {
    return [this](const char* outcome, int64_t n) {
      std::lock_guard<std::mutex> lock(mu);
      by[outcome] += n;
    };
  }
  int64_t of(const std::string& outcome) {
    std::lock_guard<std::mutex> lock(mu);
    return by[outcome];
  }
};

Span MakeSpan(const std::string& name) {
  Span s;
  s.trace_id = NewTraceId();
  s.span_id = NewSpanId();
  s.name = name;
  s.start = absl::FromUnixSeconds(1790000000);
  s.end = s.start + absl::Milliseconds(7);
  return s;
}

OtlpOptions Manual(const std::string& endpoint) {
  OtlpOptions o;
  o.endpoint = endpoint;
  o.background = false;  // nothing is sent but by ExportQueued()
  o.timeout = absl::Milliseconds(300);
  return o;
}

TEST(OtlpExporterTest, SpansArriveDecodedWithTheirIdsAttributesLinksAndResource) {
  Collector collector;
  Counts counts;
  OtlpOptions o = Manual(collector.endpoint());
  o.resource = {{"deployment.environment", "test"}};
  auto exporter = OtlpExporter::Create(o, counts.counter());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  Span call = MakeSpan("Classify");
  call.kind = Span::Kind::kServer;
  call.parent = SpanIdFromHex("00f067aa0ba902b7");
  call.Set("qvi.model", std::string("sentiment"));
  call.Set("qvi.texts", int64_t{3});
  call.Set("qvi.batch.device_ms", 1.5);
  call.Set("qvi.ok", true);
  call.status = Span::Status::kError;
  call.status_message = "NOT_FOUND: no model";
  Span batch = MakeSpan("qvi.batch");
  batch.links.push_back(SpanRef{call.trace_id, call.span_id});
  (*exporter)->Export(call);
  (*exporter)->Export(batch);
  EXPECT_EQ((*exporter)->queued(), 2u);
  ASSERT_TRUE((*exporter)->ExportQueued().ok());
  EXPECT_EQ(counts.of("exported"), 2);

  std::vector<otlp::trace::v1::Span> got = collector.spans();
  ASSERT_EQ(got.size(), 2u);
  const otlp::trace::v1::Span& c = got[0];
  EXPECT_EQ(c.name(), "Classify");
  EXPECT_EQ(c.kind(), otlp::trace::v1::Span::SPAN_KIND_SERVER);
  EXPECT_EQ(ToHex(reinterpret_cast<const uint8_t*>(c.trace_id().data()), c.trace_id().size()), ToHex(call.trace_id));
  EXPECT_EQ(ToHex(reinterpret_cast<const uint8_t*>(c.parent_span_id().data()), 8), "00f067aa0ba902b7");
  EXPECT_EQ(c.start_time_unix_nano(), uint64_t{1790000000} * 1000000000);
  EXPECT_EQ(c.end_time_unix_nano() - c.start_time_unix_nano(), uint64_t{7000000});
  ASSERT_EQ(c.attributes_size(), 4);
  EXPECT_EQ(c.attributes(0).key(), "qvi.model");
  EXPECT_EQ(c.attributes(0).value().string_value(), "sentiment");
  EXPECT_EQ(c.attributes(1).value().int_value(), 3);
  EXPECT_DOUBLE_EQ(c.attributes(2).value().double_value(), 1.5);
  EXPECT_TRUE(c.attributes(3).value().bool_value());
  EXPECT_EQ(c.status().code(), otlp::trace::v1::Status::STATUS_CODE_ERROR);
  EXPECT_EQ(c.status().message(), "NOT_FOUND: no model");
  const otlp::trace::v1::Span& b = got[1];
  EXPECT_TRUE(b.parent_span_id().empty());
  ASSERT_EQ(b.links_size(), 1);
  EXPECT_EQ(b.links(0).span_id(), c.span_id());
  EXPECT_EQ(b.links(0).trace_id(), c.trace_id());
  const otlp::collector::trace::v1::ExportTraceServiceRequest first = collector.first();
  const auto& resource = first.resource_spans(0).resource();
  std::map<std::string, std::string> attributes;
  for (const auto& kv : resource.attributes()) attributes[kv.key()] = kv.value().string_value();
  EXPECT_EQ(attributes["service.name"], "qvi-server");
  EXPECT_EQ(attributes["deployment.environment"], "test");
  EXPECT_EQ(first.resource_spans(0).scope_spans(0).scope().name(), "qvi-server");
}

TEST(OtlpExporterTest, AFullQueueDropsAndCountsAndBatchesAreBounded) {
  Collector collector;
  Counts counts;
  OtlpOptions o = Manual(collector.endpoint());
  o.max_queue = 5;
  o.max_batch = 2;
  auto exporter = OtlpExporter::Create(o, counts.counter());
  ASSERT_TRUE(exporter.ok());
  for (int i = 0; i < 8; ++i) (*exporter)->Export(MakeSpan("s" + std::to_string(i)));
  EXPECT_EQ((*exporter)->queued(), 5u);
  EXPECT_EQ(counts.of("dropped"), 3);
  ASSERT_TRUE((*exporter)->ExportQueued().ok());
  EXPECT_EQ(counts.of("exported"), 5);
  EXPECT_EQ(collector.spans().size(), 5u);
  EXPECT_EQ(collector.first().resource_spans(0).scope_spans(0).spans_size(), 2) << "max_batch spans per POST";
}

TEST(OtlpExporterTest, ACollectorThatIsDownFailsItsBatchCounted) {
  int port;
  {
    httplib::Server probe;  // a port that was free a moment ago and has no listener now
    port = probe.bind_to_any_port("127.0.0.1");
  }
  Counts counts;
  auto exporter = OtlpExporter::Create(Manual("http://127.0.0.1:" + std::to_string(port)), counts.counter());
  ASSERT_TRUE(exporter.ok());
  (*exporter)->Export(MakeSpan("lost"));
  EXPECT_EQ((*exporter)->ExportQueued().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(counts.of("failed"), 1);
  EXPECT_EQ((*exporter)->queued(), 0u) << "a failed batch is not kept";
}

TEST(OtlpExporterTest, ASlowCollectorNeverHoldsUpExportAndTimesOut) {
  Collector collector;
  collector.Hold();
  Counts counts;
  auto exporter = OtlpExporter::Create(Manual(collector.endpoint()), counts.counter());
  ASSERT_TRUE(exporter.ok());
  (*exporter)->Export(MakeSpan("first"));
  absl::Status posted;
  std::atomic<bool> posting_over{false};
  std::thread poster([&] {
    posted = (*exporter)->ExportQueued();
    posting_over = true;
  });
  while ((*exporter)->queued() > 0) std::this_thread::yield();  // the POST of "first" has begun
  // While the POST hangs on the collector, the calls' side goes on: Export only queues.
  for (int i = 0; i < 100; ++i) (*exporter)->Export(MakeSpan("meanwhile"));
  EXPECT_FALSE(posting_over) << "the exports waited for the collector";
  poster.join();  // each POST's read timeout (300 ms) ended it: "first", then the 100
  collector.Release();
  EXPECT_FALSE(posted.ok());
  EXPECT_EQ(counts.of("failed"), 101);
  EXPECT_EQ(counts.of("exported"), 0);
}

TEST(OtlpExporterTest, TheBackgroundThreadSendsOnItsOwnAndStopSendsTheRest) {
  Collector collector;
  Counts counts;
  OtlpOptions o = Manual(collector.endpoint());
  o.background = true;
  o.max_batch = 3;
  o.flush_every = absl::Hours(1);  // only a full batch wakes it before Stop
  auto exporter = OtlpExporter::Create(o, counts.counter());
  ASSERT_TRUE(exporter.ok());
  for (int i = 0; i < 3; ++i) (*exporter)->Export(MakeSpan("s"));
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (counts.of("exported") < 3 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(counts.of("exported"), 3) << "a full batch is sent without waiting for the flush interval";
  (*exporter)->Export(MakeSpan("the last"));  // a batch of one: it waits for the flush, or for Stop
  (*exporter)->Stop();
  EXPECT_EQ(counts.of("exported"), 4) << "what was queued at Stop went out";
  (*exporter)->Export(MakeSpan("late"));
  EXPECT_EQ(counts.of("dropped"), 1) << "a stopped exporter takes nothing";
}

TEST(OtlpEndpointTest, OnlyPlainHttpUrlsWithAPortAreTaken) {
  auto t = ParseOtlpEndpoint("http://collector.monitoring:4318");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "collector.monitoring");
  EXPECT_EQ(t->port, 4318);
  EXPECT_EQ(t->path, "/v1/traces");
  EXPECT_EQ(ParseOtlpEndpoint("http://127.0.0.1:9/otlp/v1/traces")->path, "/otlp/v1/traces");
  for (const char* bad : {"https://c:4318", "c:4318", "http://c", "http://c:0", "http://c:70000", "http://c:43 18"}) {
    absl::StatusOr<OtlpTarget> r = ParseOtlpEndpoint(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find("--otlp-endpoint"), std::string_view::npos);
  }
  auto attrs = ParseResourceAttributes("deployment.environment=prod, k8s.pod.name=qvi-0");
  ASSERT_TRUE(attrs.ok());
  EXPECT_EQ(attrs->at("k8s.pod.name"), "qvi-0");
  EXPECT_FALSE(ParseResourceAttributes("novalue").ok());
}

TEST(SpanTest, IdsAreRandomNonZeroAndRoundTripThroughHex) {
  EXPECT_NE(NewTraceId(), NewTraceId());
  EXPECT_NE(NewSpanId(), NewSpanId());
  EXPECT_FALSE(TraceIdFromHex("00000000000000000000000000000000").has_value()) << "all zero is invalid";
  EXPECT_FALSE(SpanIdFromHex("00f067aa0ba902bz").has_value());
  EXPECT_FALSE(SpanIdFromHex("00f067aa0ba902").has_value());
  auto id = TraceIdFromHex("4bf92f3577b34da6a3ce929d0e0e4736");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(ToHex(*id), "4bf92f3577b34da6a3ce929d0e0e4736");
}

TEST(SpanTest, SamplingFollowsTheParentElseTheRatio) {
  EXPECT_TRUE(SpanSampler(0).Sample(true)) << "a sampled parent is exported whatever the ratio";
  EXPECT_FALSE(SpanSampler(1).Sample(false)) << "an unsampled parent is not";
  EXPECT_TRUE(SpanSampler(1).Sample(std::nullopt));
  EXPECT_FALSE(SpanSampler(0).Sample(std::nullopt));
  int sampled = 0;
  SpanSampler half(0.5);
  for (int i = 0; i < 2000; ++i) sampled += half.Sample(std::nullopt) ? 1 : 0;
  EXPECT_GT(sampled, 800);  // 1000 expected; 200 is over 8 standard deviations
  EXPECT_LT(sampled, 1200);
}

TEST(BatchSpanTest, ABatchSpanLinksItsCallsInATraceOfItsOwn) {
  BatchReport r;
  r.texts = 5;
  r.tokens = 40;
  r.padded_tokens = 60;
  r.start_wall = absl::FromUnixSeconds(1790000000);
  r.compute = absl::Milliseconds(12);
  r.device = absl::Milliseconds(9);
  r.spans = {SpanRef{NewTraceId(), NewSpanId()}, SpanRef{NewTraceId(), NewSpanId()}};
  Span s = BatchSpan("sentiment", 2, r);
  EXPECT_EQ(s.name, "qvi.batch");
  EXPECT_FALSE(s.parent.has_value());
  EXPECT_NE(s.trace_id, r.spans[0].trace_id);
  EXPECT_EQ(s.links.size(), 2u);
  EXPECT_EQ(s.end - s.start, absl::Milliseconds(12));
  EXPECT_EQ(s.status, Span::Status::kUnset);
  r.ok = false;
  EXPECT_EQ(BatchSpan("sentiment", 2, r).status, Span::Status::kError);
}

TEST(OtlpLogsTest, EncodesEachRecordWithItsTraceAndAttributesUnderTheResource) {
  OtlpOptions o;
  o.resource = {{"deployment.environment", "test"}};
  LogRecord r;
  r.time = absl::FromUnixSeconds(1700000000);
  r.event_name = "qvi.decision";
  r.body = R"({"model":"sentiment"})";
  r.trace_id = TraceIdFromHex("4bf92f3577b34da6a3ce929d0e0e4736");
  r.attributes = {{"qvi.model", std::string("sentiment")}, {"qvi.version", int64_t{2}}};
  LogRecord untraced = r;
  untraced.trace_id.reset();
  otlp::collector::logs::v1::ExportLogsServiceRequest request;
  ASSERT_TRUE(request.ParseFromString(EncodeLogs(o, {r, untraced})));
  ASSERT_EQ(request.resource_logs_size(), 1);
  const auto& resource = request.resource_logs(0);
  ASSERT_EQ(resource.resource().attributes_size(), 2);
  EXPECT_EQ(resource.resource().attributes(0).value().string_value(), "qvi-server");
  const auto& records = resource.scope_logs(0).log_records();
  ASSERT_EQ(records.size(), 2);
  EXPECT_EQ(records[0].time_unix_nano(), 1700000000ull * 1000000000ull);
  EXPECT_EQ(records[0].event_name(), "qvi.decision");
  EXPECT_EQ(records[0].body().string_value(), r.body);
  EXPECT_EQ(records[0].trace_id(), std::string(reinterpret_cast<const char*>(r.trace_id->data()), 16));
  EXPECT_EQ(records[0].attributes(1).value().int_value(), 2);
  EXPECT_TRUE(records[1].trace_id().empty());
}

TEST(OtlpLogsTest, TheEndpointsPathIsTheLogsRouteByDefaultAndTheErrorNamesTheFlag) {
  EXPECT_EQ(ParseOtlpEndpoint("http://c:4318", "--decision-log-otlp-endpoint", "/v1/logs")->path, "/v1/logs");
  absl::StatusOr<OtlpTarget> bad = ParseOtlpEndpoint("c:4318", "--decision-log-otlp-endpoint", "/v1/logs");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--decision-log-otlp-endpoint: 'c:4318'")) << bad.status();
}

}  // namespace
}  // namespace qvi
