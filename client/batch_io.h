// What `qvi-client batch` reads and writes, apart from the stream (client/batch.h): the texts of a
// JSONL, CSV or plain-text file with their ids, the ids an earlier run already answered (read from
// its output, whose cut-short last line is removed), and the progress line on a terminal.
// The same formats and rules as the Python client's qvi_client.batch.
#ifndef QVI_CLIENT_BATCH_IO_H_
#define QVI_CLIENT_BATCH_IO_H_

#include <chrono>
#include <cstdint>
#include <istream>
#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace qvi::client {

struct BatchText {
  nlohmann::json id;  // the input's id (a string or a number), else the text's line number from 1
  std::string text;
};

// "jsonl", "csv" or "text", from the file's extension (.jsonl/.ndjson/.json, .csv, anything else).
std::string FormatOf(const std::string& path);

// The texts of `in` in `format`: JSONL (an object per non-blank line with a string `text_field` and
// optionally `id_field`), CSV with a header row (RFC 4180: quoted fields may hold commas, quotes
// doubled, line breaks), or plain text (every line a text, blank ones too). Throws
// std::invalid_argument naming the line when one cannot be read, lacks the text, or repeats an id.
std::vector<BatchText> ReadBatchTexts(std::istream& in, const std::string& format, const std::string& text_field,
                                      const std::string& id_field);

// The rows of a CSV document (RFC 4180); a record's trailing "\r" is dropped. Throws
// std::invalid_argument on a quote left open.
std::vector<std::vector<std::string>> ParseCsv(std::istream& in);

// The ids (their JSON) whose line in the output at `path` holds a "result". A last line without its
// newline (a run stopped while writing it) is cut off the file. No file: none.
std::set<std::string> AnsweredIds(const std::string& path);

// At most five times a second, on a terminal: "classify sentiment  1234/5000 texts  [=====>    ]  25%
// 412.3 texts/s  ETA 0:09", rewritten in place; nothing when not on a terminal.
class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressLine(std::string label, int64_t total, bool show);
  void Add(int64_t done, Clock::time_point now = Clock::now());
  void Close();
  // The line for `done` of `total` after `seconds`.
  static std::string Format(const std::string& label, int64_t done, int64_t total, double seconds);

 private:
  const std::string label_;
  const int64_t total_;
  const bool show_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
  int64_t done_ = 0;
};

}  // namespace qvi::client

#endif  // QVI_CLIENT_BATCH_IO_H_
