// What qvi-perf measures of one step, and how it reports it: the outcomes recorded inside the
// measuring window, the server's own counters over the same window (its /metrics), the percentiles,
// the JSON row and the table's line. The load loops: qvi_perf.cc.
#ifndef QVI_CLIENT_PERF_STEP_H_
#define QVI_CLIENT_PERF_STEP_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace qvi::perf {

using Clock = std::chrono::steady_clock;

// What one step measured.
struct Step {
  std::string mode;  // "closed" or "open"
  double load = 0;   // concurrency, or the offered rate in requests/s
  double seconds = 0;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;
  std::vector<double> latencies_ms;  // OK calls completed in the window
  // From the server's metrics over the window (negative when not read).
  double queue_ms = -1, compute_ms = -1, batch_size = -1;
  double server_cpu_s = -1;     // process_cpu_seconds_total's increase
  double server_switches = -1;  // qvi_process_context_switches_total{kind="voluntary"}'s increase
  double client_cpu_s = -1;     // this process's CPU time over the window
};

// This process's user + system CPU seconds so far.
double ProcessCpuSeconds();

// Sums of the server's histograms for one model: name -> (sum, count), from Prometheus text format,
// with its process CPU seconds and voluntary context switches.
std::map<std::string, std::pair<double, double>> ScrapeSums(const std::string& url, const std::string& model);

// The server's queue wait, compute time, batch size, CPU and context switches over the window between
// two scrapes.
void FillServerSplit(Step& step, const std::map<std::string, std::pair<double, double>>& before,
                     const std::map<std::string, std::pair<double, double>>& after);

// Records outcomes inside the measuring window [start, end). Closed loop: calls sent and answered
// inside it. Open loop (by_schedule): every call scheduled inside it, however late its answer, so
// that the slowest calls of an overloaded server are counted, not dropped.
class Recorder {
 public:
  Recorder(Clock::time_point start, Clock::time_point end, bool by_schedule = false)
      : start_(start), end_(end), by_schedule_(by_schedule) {}
  void Record(Clock::time_point sent, Clock::time_point done, const std::string& error) {
    if (sent < start_ || (by_schedule_ ? sent : done) >= end_) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (error.empty()) {
      ++step_.ok;
      step_.latencies_ms.push_back(std::chrono::duration<double, std::milli>(done - sent).count());
    } else {
      ++step_.errors[error];
    }
  }
  // The step measured, once every call is in: `mode` closed or open, at `load` (concurrency or rate).
  Step Take(const char* mode, double load, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    Step s = std::move(step_);
    s.mode = mode;
    s.load = load;
    s.seconds = seconds;
    return s;
  }

 private:
  const Clock::time_point start_, end_;
  const bool by_schedule_;
  std::mutex mu_;
  Step step_;
};

// The step as a JSON row (latencies sorted in place for the percentiles), and as the table's line.
nlohmann::json ToJson(Step& s, int texts_per_request);
void PrintRow(const nlohmann::json& j);

}  // namespace qvi::perf

#endif  // QVI_CLIENT_PERF_STEP_H_
