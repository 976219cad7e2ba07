#include "server/logging.h"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

namespace qvi {
namespace {

LogFormat g_format = LogFormat::kText;
// The access logger's queue and thread. async_logger holds only a weak reference to its pool.
std::shared_ptr<spdlog::details::thread_pool> g_access_pool;

std::string JsonString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// %* in a pattern: the message as the inside of a JSON string (quotes, backslashes and control
// characters escaped; invalid UTF-8 replaced).
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string quoted = JsonString(std::string(msg.payload.data(), msg.payload.size()));
    dest.append(quoted.data() + 1, quoted.data() + quoted.size() - 1);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonEscapedMessage>(); }
};

std::atomic<uint64_t> g_library_lines_suppressed{0};
std::atomic<uint64_t> g_handshake_failures{0};

// Per library: 20 lines at once, then one every 6 s (10 a minute). A server in trouble says so in
// its first lines; a client provoking the same line again and again gets no more than this.
LineBudget g_grpc_budget(20, 1.0 / 6);
LineBudget g_protobuf_budget(20, 1.0 / 6);

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void WriteLibraryLine(LineBudget& budget, const char* library, spdlog::level::level_enum level, const char* file,
                      int line, std::string_view message) {
  std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  if (!logger || !logger->should_log(level)) return;
  uint64_t refused = 0;
  if (!budget.Take(MonotonicSeconds(), &refused)) {
    ++g_library_lines_suppressed;
    return;
  }
  const char* base = std::strrchr(file, '/');
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.remove_suffix(1);
  if (refused > 0) {
    logger->log(level, "{}: {} ({}:{}; {} earlier line(s) of {} suppressed)", library, message, base ? base + 1 : file,
                line, refused, library);
  } else {
    logger->log(level, "{}: {} ({}:{})", library, message, base ? base + 1 : file, line);
  }
}

void GrpcLog(gpr_log_func_args* args) {
  const std::string_view file = args->file;
  const std::string_view message = args->message;
  // A failed TLS handshake (a plain-text client, a scanner, a client that does not trust the
  // certificate) is the client's doing and comes in several lines per connection: counted once,
  // by the line that says it failed, and written only at debug level.
  const bool handshake = file.find("ssl_transport_security") != std::string_view::npos ||
                         file.find("handshaker") != std::string_view::npos ||
                         message.find("andshak") != std::string_view::npos;
  if (handshake) {
    if (message.find("Handshake failed") != std::string_view::npos) ++g_handshake_failures;
    WriteLibraryLine(g_grpc_budget, "grpc", spdlog::level::debug, args->file, args->line, message);
    return;
  }
  const spdlog::level::level_enum level = args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
                                          : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                                                    : spdlog::level::debug;
  WriteLibraryLine(g_grpc_budget, "grpc", level, args->file, args->line, message);
}

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  const spdlog::level::level_enum to = level == google::protobuf::LOGLEVEL_INFO      ? spdlog::level::info
                                       : level == google::protobuf::LOGLEVEL_WARNING ? spdlog::level::warn
                                       : level == google::protobuf::LOGLEVEL_ERROR   ? spdlog::level::err
                                                                                     : spdlog::level::critical;
  WriteLibraryLine(g_protobuf_budget, "protobuf", to, file, line, message);
}

constexpr char kJsonTime[] = R"({"time":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l",)";

}  // namespace

void ConfigureLogging(const std::string& level, LogFormat format, size_t access_queue) {
  g_format = format;
  // A sink each: spdlog keeps the format in the sink. Both console sinks share spdlog's console
  // mutex, so their lines never interleave.
  auto main = std::make_shared<spdlog::logger>("qvi", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  g_access_pool = std::make_shared<spdlog::details::thread_pool>(access_queue, 1);
  auto access = std::make_shared<spdlog::async_logger>("access", std::make_shared<spdlog::sinks::stderr_sink_mt>(),
                                                       g_access_pool, spdlog::async_overflow_policy::overrun_oldest);
  if (format == LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(std::string(kJsonTime) + R"("msg":"%*"})");
    main->set_formatter(std::move(formatter));
    // Access messages are already the fields of a JSON object (see LogAccess).
    access->set_pattern(std::string(kJsonTime) + R"("logger":"access",%v})");
  } else {
    main->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    access->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] access %v");
  }
  main->set_level(spdlog::level::from_str(level));
  access->set_level(spdlog::level::info);
  spdlog::set_default_logger(main);
  spdlog::register_logger(access);
}

void ShutdownLogging() {
  spdlog::shutdown();     // flushes the default logger and drops the registry's loggers
  g_access_pool.reset();  // the last reference: its thread writes what is queued, then joins
}

void FlushLogsNow() {
  if (auto main = spdlog::default_logger()) main->flush();
}

bool LineBudget::Take(double now, uint64_t* refused) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_) {
    started_ = true;
    last_ = now;
  }
  tokens_ = std::min(burst_, tokens_ + std::max(0.0, now - last_) * per_second_);
  last_ = std::max(last_, now);
  if (tokens_ < 1) {
    ++refused_;
    return false;
  }
  tokens_ -= 1;
  *refused = refused_;
  refused_ = 0;
  return true;
}

void RouteLibraryLogs() {
  gpr_set_log_function(&GrpcLog);
  google::protobuf::SetLogHandler(&ProtobufLog);
}

uint64_t LibraryLinesSuppressed() { return g_library_lines_suppressed.load(); }
uint64_t TlsHandshakeFailures() { return g_handshake_failures.load(); }

uint64_t AccessLinesDropped() { return g_access_pool ? g_access_pool->overrun_counter() : 0; }

void LogAccess(const AccessRecord& r) {
  std::shared_ptr<spdlog::logger> access = spdlog::get("access");
  if (!access) return;
  if (g_format == LogFormat::kJson) {
    nlohmann::ordered_json j = {
        {"method", r.method},         {"peer", r.peer},   {"model", r.model},       {"version", r.version},
        {"request_id", r.request_id}, {"texts", r.texts}, {"tokens", r.tokens},     {"status", r.code},
        {"code", r.code_name},        {"ms", r.ms},       {"queue_ms", r.queue_ms}, {"compute_ms", r.compute_ms}};
    if (!r.key.empty()) j["key"] = r.key;
    if (!r.priority.empty()) j["priority"] = r.priority;
    if (!r.trace_id.empty()) j["trace_id"] = r.trace_id;
    if (r.traced) {
      j["prepare_ms"] = r.prepare_ms;
      j["forward_ms"] = r.forward_ms;
      j["postprocess_ms"] = r.postprocess_ms;
      j["serialize_ms"] = r.serialize_ms;
    }
    const std::string object = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    access->info(object.substr(1, object.size() - 2));
  } else {
    // The model name and request id come from the client: quoted and escaped, so that no request
    // can forge a log line.
    std::string trace;
    if (!r.key.empty()) trace = fmt::format(" key={}", r.key);  // names are [A-Za-z0-9._-]: nothing to escape
    if (!r.priority.empty()) trace += fmt::format(" priority={}", r.priority);
    if (!r.trace_id.empty()) trace += fmt::format(" trace_id={}", r.trace_id);
    if (r.traced) {
      trace += fmt::format(" prepare_ms={:.3f} forward_ms={:.3f} postprocess_ms={:.3f} serialize_ms={:.3f}",
                           r.prepare_ms, r.forward_ms, r.postprocess_ms, r.serialize_ms);
    }
    access->info(
        "method={} peer={} model={}@{} request_id={} texts={} tokens={} status={} code={} ms={:.3f} "
        "queue_ms={:.3f} compute_ms={:.3f}{}",
        r.method, r.peer, JsonString(r.model), r.version, JsonString(r.request_id), r.texts, r.tokens, r.code,
        r.code_name, r.ms, r.queue_ms, r.compute_ms, trace);
  }
}

}  // namespace qvi
