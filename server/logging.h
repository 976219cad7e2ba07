// Logging set-up (spdlog) and the access log's line.
//
// Two formats, by --log-format: `text` (human: time, level, message) and `json` (one JSON object
// per line: time, level, msg; access lines carry their fields as keys instead of msg). Both write
// to stderr. The access log (off by default, --access-log) is a logger of its own named "access".
//
// The access logger is asynchronous: a call's line is queued and written
// by one logging thread, so a slow or blocked stderr never holds up the gRPC threads that answer
// calls. When the queue (access_queue lines) is full the oldest queued line is dropped and counted
// (AccessLinesDropped, exported as qvi_access_log_dropped_lines_total). The server's own log (start-up,
// rollouts, errors) stays synchronous: it is rare and should not be lost.
#ifndef QVI_SERVER_LOGGING_H_
#define QVI_SERVER_LOGGING_H_

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace qvi {

enum class LogFormat { kText, kJson };

// Sets the default logger's level and format and creates the access logger. Call once, first.
void ConfigureLogging(const std::string& level, LogFormat format, size_t access_queue = 8192);

// Writes out the queued access lines and stops the logging thread (it blocks while stderr does).
void ShutdownLogging();

// Flushes what can be flushed without waiting for the access queue (for an exit that must not hang).
void FlushLogsNow();

// Access lines dropped so far because the queue was full (stderr slower than the calls).
uint64_t AccessLinesDropped();

// Routes what gRPC (gpr_log) and protobuf (GOOGLE_LOG) write into the server's logger, in its
// format, instead of their own plain-text lines on stderr. Clients can provoke those lines (a
// malformed message to a service protobuf parses, a plain-text connection to a TLS port), so each
// library writes at most LineBudget's burst at once and its rate after that; the lines refused are
// counted (LibraryLinesSuppressed) and the next line written says how many. gRPC's lines about a
// failed TLS handshake are not logged at all (debug level aside) but counted, one per connection
// (TlsHandshakeFailures). Call once, after ConfigureLogging and before any gRPC or protobuf use.
void RouteLibraryLogs();
uint64_t LibraryLinesSuppressed();
uint64_t TlsHandshakeFailures();

// A token bucket of log lines: `burst` at once, then `per_second`. Thread-safe; time is passed in.
class LineBudget {
 public:
  LineBudget(double burst, double per_second) : burst_(burst), per_second_(per_second), tokens_(burst) {}
  // Whether a line may be written at `now_seconds` (any monotonic clock). When it may, *refused is
  // set to the lines refused since the last one allowed.
  bool Take(double now_seconds, uint64_t* refused);

 private:
  const double burst_, per_second_;
  std::mutex mu_;
  double tokens_;
  double last_ = 0;
  bool started_ = false;
  uint64_t refused_ = 0;
};

struct AccessRecord {
  std::string method;
  std::string peer;
  std::string model;
  int64_t version = 0;
  std::string request_id;
  int64_t texts = 0;
  int64_t tokens = 0;
  int code = 0;
  std::string code_name;
  double ms = 0;          // arrival to answer
  double queue_ms = 0;    // the longest wait of its texts in the batch queue
  double compute_ms = 0;  // the longest batch it was in
  // Trace context (server/tracing/trace_context.h): the trace id, "" for none; and, when `traced`, where
  // the time went: arrival to the batch queue (parse, check, tokenise), the longest batch's forward
  // pass and post-processing, and building and serialising the answer.
  std::string trace_id;
  bool traced = false;
  // The API key's name (--api-keys; "_none" for a call without a valid key), "" when the server holds
  // no keys. Never the key itself.
  std::string key;
  // The request's priority when it is not normal ("high", "low"); "" for normal.
  std::string priority;
  double prepare_ms = 0, forward_ms = 0, postprocess_ms = 0, serialize_ms = 0;
};

// Writes one access line to the "access" logger.
void LogAccess(const AccessRecord& record);

}  // namespace qvi

#endif  // QVI_SERVER_LOGGING_H_
