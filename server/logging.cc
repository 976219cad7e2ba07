#include "server/logging.h"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <nlohmann/json.hpp>

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

uint64_t AccessLinesDropped() { return g_access_pool ? g_access_pool->overrun_counter() : 0; }

void LogAccess(const AccessRecord& r) {
  std::shared_ptr<spdlog::logger> access = spdlog::get("access");
  if (!access) return;
  if (g_format == LogFormat::kJson) {
    nlohmann::ordered_json j = {
        {"method", r.method},         {"peer", r.peer},   {"model", r.model},       {"version", r.version},
        {"request_id", r.request_id}, {"texts", r.texts}, {"tokens", r.tokens},     {"status", r.code},
        {"code", r.code_name},        {"ms", r.ms},       {"queue_ms", r.queue_ms}, {"compute_ms", r.compute_ms}};
    const std::string object = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    access->info(object.substr(1, object.size() - 2));
  } else {
    // The model name and request id come from the client: quoted and escaped, so that no request
    // can forge a log line.
    access->info(
        "method={} peer={} model={}@{} request_id={} texts={} tokens={} status={} code={} ms={:.3f} "
        "queue_ms={:.3f} compute_ms={:.3f}",
        r.method, r.peer, JsonString(r.model), r.version, JsonString(r.request_id), r.texts, r.tokens, r.code,
        r.code_name, r.ms, r.queue_ms, r.compute_ms);
  }
}

}  // namespace qvi
