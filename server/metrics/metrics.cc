#include "server/metrics/metrics.h"
#include "server/metrics/buckets.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>

#include <sys/resource.h>
#include <sys/socket.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/core/alloc/allocator.h"
#include "server/core/base/env.h"
#include "server/core/sched/priority.h"

namespace qvi {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Removes from `family`, and from `series`, every series of (model, version); the series' keys are
// tuples of (method, model, version, ...).
template <typename Series, typename Family>
void RemoveVersionSeries(Series& series, Family& family, const std::string& model, int64_t version) {
  for (auto it = series.begin(); it != series.end();) {
    if (std::get<1>(it->first) == model && std::get<2>(it->first) == version) {
      family.Remove(it->second);
      it = series.erase(it);
    } else {
      ++it;
    }
  }
}

// A counter family of the API keys (registered at start: its HELP shows before the first call).
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry, const std::string& name,
                                                       const std::string& help) {
  return BuildCounter().Name(name).Help(help).Register(registry);
}

// The state label: the repository's name of the state, in lower case ("ready").
std::string StateLabel(ModelState s) { return absl::AsciiStrToLower(ModelStateName(s)); }

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(BuildCounter()
                    .Name("qvi_requests_total")
                    .Help("Inference calls answered (Classify, Tag, ModelInfer), by model, version, method and gRPC "
                          "status code")
                    .Register(*registry_)),
      request_seconds_(BuildHistogram()
                           .Name("qvi_request_duration_seconds")
                           .Help("Time from a call's arrival to its answer, by model, version and method")
                           .Register(*registry_)),
      in_flight_(BuildGauge()
                     .Name("qvi_requests_in_flight")
                     .Help("Inference calls (Classify, Tag, ModelInfer) received and not yet answered")
                     .Register(*registry_)
                     .Add({})),
      queue_seconds_(BuildHistogram()
                         .Name("qvi_queue_duration_seconds")
                         .Help("Time a text waited in its model version's batch queue")
                         .Register(*registry_)),
      compute_seconds_(BuildHistogram()
                           .Name("qvi_compute_duration_seconds")
                           .Help("Time of one batch from its launch to its outputs on the host: inputs packed, "
                                 "forward pass, outputs copied off the device, faithfulness checks (the answers "
                                 "are timed apart); where batches are pipelined it overlaps the batch before it")
                           .Register(*registry_)),
      answer_wait_seconds_(BuildHistogram()
                               .Name("qvi_answer_wait_seconds")
                               .Help("Time from the end of a batch's turn on its instance thread to the start of "
                                     "one share of its answers (the hand-off to an answer thread)")
                               .Register(*registry_)),
      answer_seconds_(BuildHistogram()
                          .Name("qvi_answer_duration_seconds")
                          .Help("Time of one share of a batch's answers: its rows post-processed and its requests "
                                "completed (serialised, sent, logged)")
                          .Register(*registry_)),
      batch_size_(BuildHistogram().Name("qvi_batch_size").Help("Texts per batch").Register(*registry_)),
      batch_tokens_(BuildHistogram()
                        .Name("qvi_batch_tokens")
                        .Help("Padded tokens per batch (texts x the longest text)")
                        .Register(*registry_)),
      padding_ratio_(BuildHistogram()
                         .Name("qvi_batch_padding_ratio")
                         .Help("Share of a batch's padded tokens that are padding")
                         .Register(*registry_)),
      batch_failures_(BuildCounter()
                          .Name("qvi_batch_failures_total")
                          .Help("Batches whose forward pass failed or whose outputs contradicted the manifest")
                          .Register(*registry_)),
      device_busy_(BuildCounter()
                       .Name("qvi_device_busy_seconds_total")
                       .Help("Seconds the device was busy with a version's batches, where the backend knows it "
                             "(the null model's emulated device); its rate is the share of time the device was busy")
                       .Register(*registry_)),
      queue_texts_(BuildGauge()
                       .Name("qvi_queue_texts")
                       .Help("Texts waiting in a model version's batch queue")
                       .Register(*registry_)),
      model_state_(BuildGauge()
                       .Name("qvi_model_state")
                       .Help("1 for each model version's current state (loading, ready, failed, unloading)")
                       .Register(*registry_)),
      model_info_(BuildGauge()
                      .Name("qvi_model_info")
                      .Help("1 for each loaded model version, with its device, artifact format and architecture")
                      .Register(*registry_)),
      file_changes_(CounterFamily(*registry_, "qvi_model_file_changes_total",
                                  "READY versions whose model files changed in place, by model and result: reloaded "
                                  "(the new files serve) or failed (the files loaded before still serve)")),
      shed_(CounterFamily(*registry_, "qvi_queue_shed_texts_total",
                          "Queued texts whose requests were failed (RESOURCE_EXHAUSTED) to make room in a full batch "
                          "queue for a request of a higher priority, by model and priority (high, normal, low)")),
      key_requests_(CounterFamily(*registry_, "qvi_key_requests_total",
                                  "With --api-keys: inference calls by API key name and gRPC status code, and every "
                                  "call refused for its key (key \"_none\": no valid key)")),
      key_limited_(CounterFamily(*registry_, "qvi_key_limited_total",
                                 "With --api-keys: calls refused for a rate limit, by API key name and limit "
                                 "(requests, texts, tokens)")),
      model_memory_(*registry_),
      answer_mix_(*registry_) {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Serve(const std::string& host, int port) {
  auto metrics = std::make_unique<Metrics>();
  metrics->http_ = std::make_unique<httplib::Server>();
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on the same port binds too and
  // the kernel splits the scrapes between them; SO_REUSEADDR alone lets a restart rebind at once but
  // refuses a port another process listens on.
  metrics->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  Metrics* m = metrics.get();
  metrics->http_->Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    res.set_content(m->Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound =
      port == 0 ? metrics->http_->bind_to_any_port(host) : (metrics->http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", host, ":", port,
                                               " (--metrics-port): is another process listening there?"));
  }
  metrics->port_ = bound;
  metrics->http_thread_ = Env::Default()->StartThread("qvi-metrics", [m] { m->http_->listen_after_bind(); });
  return metrics;
}

Metrics::~Metrics() {
  if (http_) {
    // stop() does nothing until the listener runs (cpp-httplib 0.11); a metrics server torn down
    // right after it started must not leave its thread listening.
    for (int i = 0; i < 1000 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
  }
}

// The process's own resources under the names Prometheus's client libraries use
// (process_cpu_seconds_total, ...), read from the kernel at each scrape. With them a scrape tells the
// server's CPU per request (qvi-perf --metrics) and a soak its growth, without a second tool.
static prometheus::MetricFamily OneValueFamily(const std::string& name, const std::string& help,
                                               prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

// What malloc holds: bytes in use by the server, and bytes it keeps free for reuse. Growing RSS with
// flat "in_use" is memory the allocator keeps (fragmentation, high-water marks), not a leak; the soak
// (scripts/soak.py) reports both. Reading takes the allocator's locks, so only at a scrape.
static prometheus::MetricFamily HeapFamily() {
  const AllocatorStats stats = ReadAllocatorStats();
  prometheus::MetricFamily f;
  f.name = "qvi_malloc_bytes";
  f.help = "Bytes held by malloc (allocator: glibc, jemalloc or tcmalloc): in_use by the server, free for reuse";
  f.type = prometheus::MetricType::Gauge;
  const std::pair<const char*, double> states[] = {{"in_use", stats.in_use_bytes}, {"free", stats.free_bytes}};
  for (const auto& [state, bytes] : states) {
    prometheus::ClientMetric m;
    m.label.push_back({"allocator", stats.allocator});
    m.label.push_back({"state", state});
    m.gauge.value = bytes;
    f.metric.push_back(m);
  }
  return f;
}

// Times the process's threads gave up a CPU: voluntary (to wait: a lock, a condition variable, a
// socket -- each one a sleep and a later wake-up) and involuntary (preempted). Per request, the
// voluntary ones count the thread hand-offs of the serving path, a figure that does not move with
// the machine's speed as CPU time does (qvi-perf --metrics: `srv sw/r`).
static prometheus::MetricFamily ContextSwitchFamily(const rusage& usage) {
  prometheus::MetricFamily f;
  f.name = "qvi_process_context_switches_total";
  f.help = "Context switches of the server's threads: voluntary (blocked to wait) and involuntary (preempted)";
  f.type = prometheus::MetricType::Counter;
  const std::pair<const char*, long> kinds[] = {{"voluntary", usage.ru_nvcsw}, {"involuntary", usage.ru_nivcsw}};
  for (const auto& [kind, count] : kinds) {
    prometheus::ClientMetric m;
    m.label.push_back({"kind", kind});
    m.counter.value = static_cast<double>(count);
    f.metric.push_back(m);
  }
  return f;
}

static std::vector<prometheus::MetricFamily> ProcessMetrics() {
  const auto& family = OneValueFamily;
  std::vector<prometheus::MetricFamily> out;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                       static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    out.push_back(family("process_cpu_seconds_total", "User and system CPU time spent in seconds",
                         prometheus::MetricType::Counter, cpu));
    out.push_back(ContextSwitchFamily(usage));
  }
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) {
      out.push_back(family("process_resident_memory_bytes", "Resident memory size in bytes",
                           prometheus::MetricType::Gauge, 1024.0 * std::stod(line.substr(6))));
    } else if (line.rfind("Threads:", 0) == 0) {
      out.push_back(family("process_threads", "Number of OS threads in the process", prometheus::MetricType::Gauge,
                           std::stod(line.substr(8))));
    }
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    ++fds;
  }
  if (!ec)
    out.push_back(family("process_open_fds", "Number of open file descriptors", prometheus::MetricType::Gauge, fds));
  out.push_back(HeapFamily());
  return out;
}

void Metrics::AddScrapedCounter(const std::string& name, const std::string& help, std::function<double()> read) {
  MutexLock lock(&mu_);
  scraped_.push_back({name, help, std::move(read), false});
}

void Metrics::AddScrapedGauge(const std::string& name, const std::string& help, std::function<double()> read) {
  MutexLock lock(&mu_);
  scraped_.push_back({name, help, std::move(read), true});
}

std::string Metrics::Serialize() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : ProcessMetrics()) families.push_back(std::move(f));
  {
    MutexLock lock(&mu_);
    for (const ScrapedCounter& c : scraped_) {
      families.push_back(OneValueFamily(
          c.name, c.help, c.gauge ? prometheus::MetricType::Gauge : prometheus::MetricType::Counter, c.read()));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::OnRequestStart() { in_flight_.Increment(); }

void Metrics::OnRequestDone(const std::string& method, const std::string& model, int64_t version,
                            const std::string& code, absl::Duration latency) {
  in_flight_.Decrement();
  prometheus::Counter* counter = nullptr;
  prometheus::Histogram* histogram = nullptr;
  {
    MutexLock lock(&mu_);
    prometheus::Counter*& c = request_counters_[{method, model, version, code}];
    if (c == nullptr) {
      c = &requests_.Add({{"model", model}, {"version", absl::StrCat(version)}, {"method", method}, {"code", code}});
    }
    counter = c;
    prometheus::Histogram*& h = request_latency_[{method, model, version}];
    if (h == nullptr) {
      h = &request_seconds_.Add({{"model", model}, {"version", absl::StrCat(version)}, {"method", method}},
                                LatencyBuckets());
    }
    histogram = h;
  }
  counter->Increment();
  histogram->Observe(absl::ToDoubleSeconds(latency));
}

void Metrics::CountKey(bool limited, const std::string& key, const std::string& value) {
  prometheus::Counter* counter = nullptr;
  {
    MutexLock lock(&mu_);
    prometheus::Counter*& c = (limited ? key_limited_counters_ : key_counters_)[{key, value}];
    if (c == nullptr) {
      c = limited ? &key_limited_.Add({{"key", key}, {"limit", value}})
                  : &key_requests_.Add({{"key", key}, {"code", value}});
    }
    counter = c;
  }
  counter->Increment();
}

void Metrics::OnKeyRequest(const std::string& key, const std::string& code) { CountKey(false, key, code); }

void Metrics::OnKeyLimited(const std::string& key, const std::string& limit) { CountKey(true, key, limit); }

Metrics::VersionSeries& Metrics::SeriesFor(const std::string& model, int64_t version) {
  VersionSeries& s = versions_[{model, version}];
  if (s.queue == nullptr) {
    const prometheus::Labels labels{{"model", model}, {"version", absl::StrCat(version)}};
    s.queue = &queue_seconds_.Add(labels, LatencyBuckets());
    s.compute = &compute_seconds_.Add(labels, LatencyBuckets());
    s.answer_wait = &answer_wait_seconds_.Add(labels, LatencyBuckets());
    s.answer = &answer_seconds_.Add(labels, LatencyBuckets());
    s.batch_size = &batch_size_.Add(labels, PowersOfTwo(1, 1024));
    s.batch_tokens = &batch_tokens_.Add(labels, PowersOfTwo(16, 1 << 20));
    s.padding = &padding_ratio_.Add(labels, Ratios());
    s.batch_failures = &batch_failures_.Add(labels);
    s.device_busy = &device_busy_.Add(labels);
    s.queue_texts = &queue_texts_.Add(labels);
    s.tokens = &answer_mix_.tokens.Add(labels);
  }
  return s;
}

void Metrics::OnBatch(const std::string& model, int64_t version, const BatchReport& batch) {
  VersionSeries s;
  {
    MutexLock lock(&mu_);
    s = SeriesFor(model, version);
  }
  for (absl::Duration wait : batch.queue_waits) s.queue->Observe(absl::ToDoubleSeconds(wait));
  s.compute->Observe(absl::ToDoubleSeconds(batch.compute));
  s.batch_size->Observe(batch.texts);
  s.batch_tokens->Observe(static_cast<double>(batch.padded_tokens));
  if (batch.padded_tokens > 0) {
    s.padding->Observe(1.0 - static_cast<double>(batch.tokens) / static_cast<double>(batch.padded_tokens));
  }
  if (!batch.ok) s.batch_failures->Increment();
  if (batch.ok) s.tokens->Increment(static_cast<double>(batch.tokens));
  if (batch.device > absl::ZeroDuration()) s.device_busy->Increment(absl::ToDoubleSeconds(batch.device));
}

void Metrics::OnAnswers(const std::string& model, int64_t version, const AnswerReport& answers) {
  VersionSeries s;
  {
    MutexLock lock(&mu_);
    s = SeriesFor(model, version);
  }
  s.answer_wait->Observe(absl::ToDoubleSeconds(answers.wait));
  s.answer->Observe(absl::ToDoubleSeconds(answers.run));
}

void Metrics::OnQueueDepth(const std::string& model, int64_t version, size_t texts) {
  prometheus::Gauge* gauge = nullptr;
  {
    MutexLock lock(&mu_);
    gauge = SeriesFor(model, version).queue_texts;
  }
  gauge->Set(static_cast<double>(texts));
}

void Metrics::OnShed(const std::string& model, int64_t /*version*/, int level, size_t texts) {
  // Family::Add finds the series when it exists: at most three per model.
  shed_.Add({{"model", model}, {"priority", std::string(PriorityName(static_cast<Priority>(level)))}})
      .Increment(static_cast<double>(texts));
}

void Metrics::OnModelFilesChanged(const std::string& model, bool reloaded) {
  // Family::Add finds the series when it exists; one series per model and result, models are few.
  file_changes_.Add({{"model", model}, {"result", reloaded ? "reloaded" : "failed"}}).Increment();
}

void Metrics::OnModelEvent(const std::string& model, const VersionStatus& status) {
  MutexLock lock(&mu_);
  const std::pair<std::string, int64_t> key{model, status.version};
  auto [it, created] = state_.try_emplace(key, nullptr, nullptr);
  if (it->second.first != nullptr) model_state_.Remove(it->second.first);
  if (it->second.second != nullptr) model_info_.Remove(it->second.second);
  it->second = {nullptr, nullptr};
  SetModelMemory(model, status);
  if (status.state == ModelState::kUnloaded) {
    state_.erase(it);
    auto series = versions_.find(key);
    if (series != versions_.end()) {
      // Histograms of an unloaded version go too: its numbers live on in Prometheus' history.
      queue_seconds_.Remove(series->second.queue);
      compute_seconds_.Remove(series->second.compute);
      answer_wait_seconds_.Remove(series->second.answer_wait);
      answer_seconds_.Remove(series->second.answer);
      batch_size_.Remove(series->second.batch_size);
      batch_tokens_.Remove(series->second.batch_tokens);
      padding_ratio_.Remove(series->second.padding);
      batch_failures_.Remove(series->second.batch_failures);
      device_busy_.Remove(series->second.device_busy);
      queue_texts_.Remove(series->second.queue_texts);
      answer_mix_.tokens.Remove(series->second.tokens);
      versions_.erase(series);
    }
    // And its request counters and latencies: with a version rolled out every day, they would
    // otherwise pile up for the life of the process.
    RemoveVersionSeries(request_counters_, requests_, model, status.version);
    RemoveVersionSeries(request_latency_, request_seconds_, model, status.version);
    return;
  }
  const std::string version = absl::StrCat(status.version);
  it->second.first = &model_state_.Add({{"model", model}, {"version", version}, {"state", StateLabel(status.state)}});
  it->second.first->Set(1);
  if (status.model != nullptr) {
    it->second.second = &model_info_.Add({{"model", model},
                                          {"version", version},
                                          {"device", status.model->device()},
                                          {"format", status.model->format()},
                                          {"architecture", status.model->manifest().architecture}});
    it->second.second->Set(1);
  }
}

}  // namespace qvi
