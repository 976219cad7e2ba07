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
};

// Writes one access line to the "access" logger.
void LogAccess(const AccessRecord& record);

}  // namespace qvi

#endif  // QVI_SERVER_LOGGING_H_
