#include "server/tracing/otlp_exporter.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "opentelemetry/proto/collector/logs/v1/logs_service.pb.h"
#include "opentelemetry/proto/collector/trace/v1/trace_service.pb.h"
#include "server/core/base/exception_text.h"
#include "spdlog/spdlog.h"

namespace qvi {

namespace otlp = ::opentelemetry::proto;

absl::StatusOr<OtlpTarget> ParseOtlpEndpoint(const std::string& endpoint, const char* flag, const char* default_path) {
  static const std::regex kUrl(R"(^http://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})(/[^\s?#]*)?$)");
  std::smatch m;
  int port = 0;
  if (!std::regex_match(endpoint, m, kUrl) || !absl::SimpleAtoi(m[2].str(), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", endpoint.substr(0, 128),
                     "' is not http://host:port[/path] (OTLP/HTTP; for https, run a collector beside the server)"));
  }
  OtlpTarget target;
  target.host = m[1].str();
  target.port = port;
  target.path = m[3].matched && m[3].str() != "/" ? m[3].str() : default_path;
  return target;
}

absl::StatusOr<std::map<std::string, std::string>> ParseResourceAttributes(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    pair = absl::StripAsciiWhitespace(pair);
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--otlp-resource-attributes: '", pair.substr(0, 64), "' is not key=value"));
    }
    out[std::string(absl::StripTrailingAsciiWhitespace(pair.substr(0, eq)))] =
        std::string(absl::StripLeadingAsciiWhitespace(pair.substr(eq + 1)));
  }
  return out;
}

namespace {

void SetValue(otlp::common::v1::AnyValue* out, const Span::Value& value) {
  if (const auto* s = std::get_if<std::string>(&value)) {
    out->set_string_value(*s);
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out->set_int_value(*i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    out->set_double_value(*d);
  } else {
    out->set_bool_value(std::get<bool>(value));
  }
}

void AddAttribute(google::protobuf::RepeatedPtrField<otlp::common::v1::KeyValue>* attributes, const std::string& key,
                  const Span::Value& value) {
  otlp::common::v1::KeyValue* kv = attributes->Add();
  kv->set_key(key);
  SetValue(kv->mutable_value(), value);
}

uint64_t UnixNanos(absl::Time t) { return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixNanos(t))); }

template <size_t N>
std::string Bytes(const std::array<uint8_t, N>& id) {
  return std::string(reinterpret_cast<const char*>(id.data()), N);
}

void FillResource(const OtlpOptions& options, otlp::resource::v1::Resource* resource) {
  auto* attributes = resource->mutable_attributes();
  AddAttribute(attributes, "service.name", options.service_name);
  for (const auto& [key, value] : options.resource) {
    if (key != "service.name") AddAttribute(attributes, key, value);
  }
}

}  // namespace

std::string EncodeSpans(const OtlpOptions& options, const std::vector<Span>& spans) {
  otlp::collector::trace::v1::ExportTraceServiceRequest request;
  otlp::trace::v1::ResourceSpans* resource = request.add_resource_spans();
  FillResource(options, resource->mutable_resource());
  otlp::trace::v1::ScopeSpans* scope = resource->add_scope_spans();
  scope->mutable_scope()->set_name("qvi-server");
  for (const Span& s : spans) {
    otlp::trace::v1::Span* out = scope->add_spans();
    out->set_trace_id(Bytes(s.trace_id));
    out->set_span_id(Bytes(s.span_id));
    if (s.parent) out->set_parent_span_id(Bytes(*s.parent));
    out->set_name(s.name);
    out->set_kind(static_cast<otlp::trace::v1::Span::SpanKind>(static_cast<int>(s.kind)));
    out->set_start_time_unix_nano(UnixNanos(s.start));
    out->set_end_time_unix_nano(UnixNanos(std::max(s.start, s.end)));
    for (const auto& [key, value] : s.attributes) AddAttribute(out->mutable_attributes(), key, value);
    for (const SpanRef& link : s.links) {
      otlp::trace::v1::Span::Link* l = out->add_links();
      l->set_trace_id(Bytes(link.trace_id));
      l->set_span_id(Bytes(link.span_id));
    }
    if (s.status != Span::Status::kUnset) {
      out->mutable_status()->set_code(static_cast<otlp::trace::v1::Status::StatusCode>(static_cast<int>(s.status)));
      out->mutable_status()->set_message(s.status_message);
    }
  }
  return request.SerializeAsString();
}

std::string EncodeLogs(const OtlpOptions& options, const std::vector<LogRecord>& records) {
  otlp::collector::logs::v1::ExportLogsServiceRequest request;
  otlp::logs::v1::ResourceLogs* resource = request.add_resource_logs();
  FillResource(options, resource->mutable_resource());
  otlp::logs::v1::ScopeLogs* scope = resource->add_scope_logs();
  scope->mutable_scope()->set_name("qvi-server");
  for (const LogRecord& r : records) {
    otlp::logs::v1::LogRecord* out = scope->add_log_records();
    out->set_time_unix_nano(UnixNanos(r.time));
    out->set_observed_time_unix_nano(UnixNanos(r.time));
    out->set_severity_number(otlp::logs::v1::SEVERITY_NUMBER_INFO);
    out->set_severity_text("INFO");
    out->set_event_name(r.event_name);
    out->mutable_body()->set_string_value(r.body);
    if (r.trace_id) out->set_trace_id(Bytes(*r.trace_id));
    for (const auto& [key, value] : r.attributes) AddAttribute(out->mutable_attributes(), key, value);
  }
  return request.SerializeAsString();
}

absl::StatusOr<std::unique_ptr<OtlpLogExporter>> OtlpLogExporter::Create(OtlpOptions options, const char* flag,
                                                                         Counter counter) {
  absl::StatusOr<OtlpTarget> target = ParseOtlpEndpoint(options.endpoint, flag, "/v1/logs");
  if (!target.ok()) return target.status();
  return std::unique_ptr<OtlpLogExporter>(
      new OtlpLogExporter(std::move(options), *std::move(target), std::move(counter)));
}

OtlpLogExporter::OtlpLogExporter(OtlpOptions options, OtlpTarget target, Counter counter)
    : batcher_(std::move(options), std::move(target), EncodeLogs, std::move(counter),
               [](const OtlpOptions& o, int64_t records, const absl::Status& why) {
                 spdlog::warn("OTLP export of {} log record(s) to {} failed: {}", records, o.endpoint,
                              std::string(why.message()));
               }) {}

absl::StatusOr<std::unique_ptr<OtlpExporter>> OtlpExporter::Create(OtlpOptions options, Counter counter) {
  absl::StatusOr<OtlpTarget> target = ParseOtlpEndpoint(options.endpoint);
  if (!target.ok()) return target.status();
  if (options.max_queue < 1 || options.max_batch < 1) {
    return absl::InvalidArgumentError("--otlp-queue-spans: at least 1");
  }
  return std::unique_ptr<OtlpExporter>(new OtlpExporter(std::move(options), *std::move(target), std::move(counter)));
}

OtlpExporter::OtlpExporter(OtlpOptions options, OtlpTarget target, Counter counter)
    : batcher_(std::move(options), std::move(target), EncodeSpans, std::move(counter),
               [](const OtlpOptions& o, int64_t spans, const absl::Status& why) {
                 spdlog::warn("OTLP export of {} span(s) to {} failed: {}", spans, o.endpoint,
                              std::string(why.message()));
               }) {}

absl::Status PostOtlp(const OtlpTarget& target, absl::Duration timeout, const std::string& body) {
  try {
    httplib::Client client(target.host, target.port);
    const auto t = absl::ToChronoMicroseconds(timeout);
    client.set_connection_timeout(t);
    client.set_read_timeout(t);
    client.set_write_timeout(t);
    httplib::Result result = client.Post(target.path.c_str(), body, "application/x-protobuf");
    if (!result) return absl::UnavailableError(absl::StrCat("no answer (", httplib::to_string(result.error()), ")"));
    if (result->status < 200 || result->status >= 300) {
      return absl::UnavailableError(absl::StrCat("HTTP ", result->status, " ", result->body.substr(0, 200)));
    }
    return absl::OkStatus();
  } catch (...) {
    return absl::InternalError(absl::StrCat("posting failed: ", CurrentExceptionText()));
  }
}

}  // namespace qvi
