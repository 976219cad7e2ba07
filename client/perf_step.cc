#include "client/perf_step.h"

#include <httplib.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>

namespace qvi::perf {
namespace {

double Percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[i];
}

// The server's voluntary context switches, as its /metrics writes the series.
constexpr char kVoluntarySwitches[] = "qvi_process_context_switches_total{kind=\"voluntary\"} ";

}  // namespace

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::map<std::string, std::pair<double, double>> ScrapeSums(const std::string& url, const std::string& model) {
  std::map<std::string, std::pair<double, double>> out;
  static const std::regex kUrl(R"(^(https?://[^/]+)(/.*)$)");
  std::smatch m;
  if (!std::regex_match(url, m, kUrl)) return out;
  httplib::Client cli(m[1].str());
  cli.set_connection_timeout(5);
  auto res = cli.Get(m[2].str());
  if (!res || res->status != 200) return out;
  std::istringstream in(res->body);
  const std::string label = "model=\"" + model + "\"";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("process_cpu_seconds_total ", 0) == 0) {  // the server process's own, unlabelled
      out["process_cpu_seconds_total"] = {std::stod(line.substr(line.rfind(' ') + 1)), 1};
      continue;
    }
    if (line.rfind(kVoluntarySwitches, 0) == 0) {  // the server process's, labelled by kind only
      out[kVoluntarySwitches] = {std::stod(line.substr(line.rfind(' ') + 1)), 1};
      continue;
    }
    if (line.empty() || line[0] == '#' || line.find(label) == std::string::npos) continue;
    const size_t brace = line.find('{');
    const std::string name = line.substr(0, brace);
    const double value = std::stod(line.substr(line.rfind(' ') + 1));
    for (const char* suffix : {"_sum", "_count"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        auto& slot = out[name.substr(0, name.size() - s.size())];
        (s == "_sum" ? slot.first : slot.second) += value;
      }
    }
  }
  return out;
}

void FillServerSplit(Step& step, const std::map<std::string, std::pair<double, double>>& before,
                     const std::map<std::string, std::pair<double, double>>& after) {
  auto mean = [&](const std::string& name, double scale) {
    auto a = after.find(name), b = before.find(name);
    if (a == after.end()) return -1.0;
    const double sum = a->second.first - (b == before.end() ? 0 : b->second.first);
    const double count = a->second.second - (b == before.end() ? 0 : b->second.second);
    return count > 0 ? scale * sum / count : -1.0;
  };
  step.queue_ms = mean("qvi_queue_duration_seconds", 1000);
  step.compute_ms = mean("qvi_compute_duration_seconds", 1000);
  step.batch_size = mean("qvi_batch_size", 1);
  auto a = after.find("process_cpu_seconds_total"), b = before.find("process_cpu_seconds_total");
  if (a != after.end() && b != before.end()) step.server_cpu_s = a->second.first - b->second.first;
  auto sa = after.find(kVoluntarySwitches), sb = before.find(kVoluntarySwitches);
  if (sa != after.end() && sb != before.end()) step.server_switches = sa->second.first - sb->second.first;
}

nlohmann::json ToJson(Step& s, int texts_per_request) {
  std::sort(s.latencies_ms.begin(), s.latencies_ms.end());
  nlohmann::json j = {{"mode", s.mode},
                      {"load", s.load},
                      {"seconds", s.seconds},
                      {"ok", s.ok},
                      {"requests_per_s", s.ok / s.seconds},
                      {"texts_per_s", s.ok * texts_per_request / s.seconds},
                      {"p50_ms", Percentile(s.latencies_ms, 50)},
                      {"p90_ms", Percentile(s.latencies_ms, 90)},
                      {"p99_ms", Percentile(s.latencies_ms, 99)},
                      {"p999_ms", Percentile(s.latencies_ms, 99.9)},
                      {"errors", s.errors}};
  if (s.queue_ms >= 0) j["server_queue_ms"] = s.queue_ms;
  if (s.compute_ms >= 0) j["server_compute_ms"] = s.compute_ms;
  if (s.batch_size >= 0) j["server_batch_size"] = s.batch_size;
  // CPU cores busy over the window, and CPU microseconds per request, for this load generator and
  // (with --metrics) for the server: the per-request cost, and proof that the generator is not the limit.
  if (s.client_cpu_s >= 0) {
    j["client_cores"] = s.client_cpu_s / s.seconds;
    if (s.ok > 0) j["client_cpu_us_per_request"] = 1e6 * s.client_cpu_s / static_cast<double>(s.ok);
  }
  if (s.server_cpu_s >= 0) {
    j["server_cores"] = s.server_cpu_s / s.seconds;
    if (s.ok > 0) j["server_cpu_us_per_request"] = 1e6 * s.server_cpu_s / static_cast<double>(s.ok);
  }
  // The server's threads' voluntary context switches per request: its hand-offs (a sleep and a wake-up
  // each), counted rather than timed, so steady where CPU time drifts with the machine.
  if (s.server_switches >= 0 && s.ok > 0) {
    j["server_switches_per_request"] = s.server_switches / static_cast<double>(s.ok);
  }
  return j;
}

void PrintRow(const nlohmann::json& j) {
  int64_t errors = 0;
  for (const auto& [_, n] : j["errors"].items()) errors += n.get<int64_t>();
  auto opt = [&j](const char* key) {
    char buf[16];
    if (!j.contains(key)) return std::string("-");
    std::snprintf(buf, sizeof(buf), "%.2f", j[key].get<double>());
    return std::string(buf);
  };
  std::printf("%-6s %7.1f %9.1f %9.1f %8.2f %8.2f %8.2f %8.2f %7lld %9s %10s %6s %8s %8s %8s\n",
              j["mode"].get<std::string>().c_str(), j["load"].get<double>(), j["requests_per_s"].get<double>(),
              j["texts_per_s"].get<double>(), j["p50_ms"].get<double>(), j["p90_ms"].get<double>(),
              j["p99_ms"].get<double>(), j["p999_ms"].get<double>(), static_cast<long long>(errors),
              opt("server_queue_ms").c_str(), opt("server_compute_ms").c_str(), opt("server_batch_size").c_str(),
              opt("client_cpu_us_per_request").c_str(), opt("server_cpu_us_per_request").c_str(),
              opt("server_switches_per_request").c_str());
  std::fflush(stdout);
}

}  // namespace qvi::perf
