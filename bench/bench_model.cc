// qvi-bench-model: the limit a server is measured against — the model called in process from C++
// (qvi::Model, the same code the server runs), no RPC, on padded batches of the same generated
// texts qvi-perf sends, at each batch size. Tokenisation is done once, up front: this is the
// model's own speed. With --format both, the TorchScript file and the AOTInductor package of the
// version are measured side by side, alternating at each batch size.
//
//   qvi-bench-model --model model_store/store/sentiment/1 --format both --batch-sizes 1,2,4,8,16,32
//   qvi-bench-model --model DIR --format pt2 --cpu-packages base,x86-64-v4-bf16,x86-64-v4-int8  (each CPU package)
//   qvi-bench-model --model DIR --format pt2 --batch-sizes 1 --idle-us 0,500   (a forward after an idle gap)
//
// --idle-us sleeps that long before each timed forward (the thread blocks, as a server's instance
// thread does between the requests of a lone caller), so a forward that finds the caches and the
// core cold is measured beside the back-to-back loop; the sleep itself is not timed. With
// --idle-spin the thread spins through the gap instead of sleeping: what a forward costs when only
// the core's idling, not the time, is taken away.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "client/load_texts.h"
#include "server/core/model/model.h"
#include "server/core/runner/model_runner.h"

namespace {

// Every (model, idle gap) pair, models outermost: the steps one batch size measures side by side.
std::vector<std::pair<const qvi::Model*, int>> Combinations(const std::vector<std::unique_ptr<qvi::Model>>& models,
                                                            const std::vector<int>& idle_us) {
  std::vector<std::pair<const qvi::Model*, int>> out;
  for (const auto& m : models) {
    for (int idle : idle_us) out.emplace_back(m.get(), idle);
  }
  return out;
}

struct Flags {
  std::string path, json, device = "cpu", format = "both", maps = "off", graphs = "off";
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  std::vector<std::string> cpu_packages = {"auto"};
  std::vector<int> idle_us = {0};
  double seconds = 5, words = 20, words_stddev = 5;
  int pool = 1000, threads = 1;
  uint32_t seed = 1;
  bool explain = false, idle_spin = false;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.path, "the version folder (model.pt and/or model.<device>.pt2)")->required();
  app.add_option("--format", f.format, "torchscript, pt2, or both (measured side by side)")
      ->check(CLI::IsMember({"torchscript", "pt2", "both"}))
      ->capture_default_str();
  app.add_option("--batch-sizes", f.batch_sizes, "batch sizes to measure")->delimiter(',');
  app.add_option("--cpu-packages", f.cpu_packages,
                 "the CPU packages of the pt2 format to measure side by side: auto (what the server picks), "
                 "base (model.cpu.pt2), x86-64-v4, x86-64-v4-bf16, x86-64-v4-int8")
      ->delimiter(',')
      ->check([](const std::string& name) {
        absl::Status s = qvi::CheckCpuPackage(name);
        return s.ok() ? std::string() : std::string(s.message());
      })
      ->capture_default_str();
  app.add_option("--seconds", f.seconds, "seconds per batch size")->capture_default_str();
  app.add_option("--device", f.device, "cpu, cuda, auto")->capture_default_str();
  app.add_option("--torch-threads", f.threads, "torch intra-op threads")->capture_default_str();
  app.add_option("--pool", f.pool, "generated texts")->capture_default_str();
  app.add_option("--words", f.words, "mean length of the generated texts, in words")->capture_default_str();
  app.add_option("--words-stddev", f.words_stddev, "standard deviation of the length")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the generated texts (qvi-perf's default is 1)")->capture_default_str();
  app.add_option("--maps", f.maps,
                 "ask for the per-layer attention maps: off (the model skips them when it can), on, or both "
                 "(each batch size measured without and with, side by side)")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->capture_default_str();
  app.add_flag("--explain", f.explain, "also ask for the explanations α and β (attention, gates)");
  app.add_option("--cuda-graphs", f.graphs,
                 "on a GPU, replay CUDA graphs captured per batch-size and length bucket (the server's default "
                 "buckets): off, on, or both (each format loaded twice and measured side by side)")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->capture_default_str();
  app.add_option("--idle-us", f.idle_us,
                 "microseconds the thread sleeps before each timed forward; several are measured side by side "
                 "(0: back to back)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1000000));
  app.add_flag("--idle-spin", f.idle_spin, "spin through the --idle-us gap instead of sleeping");
  app.add_option("--json", f.json, "also write the results as JSON here");
}

// One model loaded for each format and CPU package asked for, with and without CUDA graphs as asked.
absl::StatusOr<std::vector<std::unique_ptr<qvi::Model>>> LoadModels(const Flags& f, qvi::GraphBackend* backend) {
  std::vector<std::unique_ptr<qvi::Model>> models;
  std::vector<std::pair<std::string, std::string>> loads;  // format, CPU package
  for (const std::string format : {"torchscript", "pt2"}) {
    if (f.format != "both" && f.format != format) continue;
    if (format == "torchscript") loads.emplace_back(format, "auto");
    for (const std::string& package : f.cpu_packages) {
      if (format == "pt2") loads.emplace_back(format, package);
    }
  }
  for (const auto& [format, package] : loads) {
    for (bool with_graphs : {false, true}) {
      if ((with_graphs && f.graphs == "off") || (!with_graphs && f.graphs == "on")) continue;
      qvi::LoadOptions options;
      options.device = f.device;
      options.format = *qvi::ParseModelFormat(format);
      options.cpu_package = package;
      absl::StatusOr<std::unique_ptr<qvi::Model>> loaded = qvi::Model::Load(f.path, options);
      if (!loaded.ok()) return absl::Status(loaded.status().code(), format + ": " + loaded.status().ToString());
      qvi::ServingConfig serving;
      serving.cuda_graphs.enabled = with_graphs;
      // Buckets up to the largest batch measured (the lengths: up to the model's max_tokens).
      serving.max_batch_size = *std::max_element(f.batch_sizes.begin(), f.batch_sizes.end());
      if (absl::Status s = (*loaded)->PrepareGraphs(serving, backend); !s.ok()) return s;
      const qvi::GraphReport& r = (*loaded)->graphs();
      if (with_graphs) {
        std::cerr << format << " CUDA graphs: " << r.note << "; captured in " << r.capture_ms << " ms, "
                  << r.memory_bytes / 1048576.0 << " MiB\n";
        if (!r.active) return absl::FailedPreconditionError(format + ": no CUDA graph was captured");
      }
      models.push_back(*std::move(loaded));
    }
  }
  return models;
}

// The generated texts' token ids, as the server's tokenizer and vocabulary make them.
absl::StatusOr<std::vector<std::vector<int64_t>>> TokenIds(const qvi::Model& model, const Flags& f) {
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& text : qvi::client::GenerateTexts(f.pool, f.words, f.words_stddev, f.seed)) {
    absl::StatusOr<std::vector<qvi::TextToken>> tokens = model.tokenizer().Tokenize(text);
    if (!tokens.ok()) return tokens.status();
    std::vector<int64_t> row;
    for (const qvi::TextToken& t : *tokens) {
      if (static_cast<int>(row.size()) == model.manifest().tokenizer.max_tokens) break;
      row.push_back(model.vocabulary().Id(t.normalized));
    }
    ids.push_back(std::move(row));
  }
  return ids;
}

// What each row measured: the format, and for a CPU package which one ("pt2 x86-64-v4-bf16").
std::string Label(const qvi::Model& m) {
  const std::string file = std::filesystem::path(m.file()).filename().string();
  if (m.format() != "pt2" || file == "model.cuda.pt2") return m.format();
  if (file == "model.cpu.pt2") return std::string("pt2 base");
  return "pt2 " + file.substr(10, file.size() - 14);  // model.cpu.<name>.pt2
}

// Sleeps (or spins) `idle` microseconds; the seconds it took.
double IdleGap(int idle, bool spin) {
  const auto before = std::chrono::steady_clock::now();
  if (spin) {
    while (std::chrono::steady_clock::now() - before < std::chrono::microseconds(idle)) {
    }
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(idle));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
}

// One step: batches of `bs` texts for --seconds, each after an idle gap of `idle` microseconds; its
// row printed and returned as JSON.
absl::StatusOr<nlohmann::json> MeasureStep(const qvi::Model& m, const std::vector<std::vector<int64_t>>& ids, int bs,
                                           bool with_maps, const qvi::OutputSet& asked, int idle, const Flags& f) {
  std::vector<double> ms;
  size_t next = 0;
  int64_t texts = 0;
  double slept = 0;  // seconds, left out of the throughput
  const auto start = std::chrono::steady_clock::now();
  const auto end =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(f.seconds));
  while (std::chrono::steady_clock::now() < end) {
    if (idle > 0) slept += IdleGap(idle, f.idle_spin);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<const std::vector<int64_t>*> batch;
    for (int b = 0; b < bs; ++b) batch.push_back(&ids[(next + b) % ids.size()]);
    const qvi::PackedBatch packed = qvi::PackTokenIds(batch);  // as the server's runner packs a batch
    next += bs;
    auto out = m.Forward(packed.ids, packed.mask, asked);
    if (!out.ok()) return out.status();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    texts += bs;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - slept;
  std::sort(ms.begin(), ms.end());
  const double p50 = ms[ms.size() / 2], p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  std::printf("%6d %5s %20s %6s %8d %10.1f %10.1f %10.3f %10.3f\n", bs, with_maps ? "on" : "off", Label(m).c_str(),
              m.graphs().active ? "on" : "off", idle, texts / elapsed, ms.size() / elapsed, p50, p99);
  return nlohmann::json{{"batch_size", bs},
                        {"maps", with_maps},
                        {"format", m.format()},
                        {"file", std::filesystem::path(m.file()).filename().string()},
                        {"cuda_graphs", m.graphs().active},
                        {"idle_us", idle},
                        {"texts_per_s", texts / elapsed},
                        {"batches_per_s", ms.size() / elapsed},
                        {"p50_ms", p50},
                        {"p99_ms", p99}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qvi-bench-model: in-process forward throughput of a model version at each batch size",
               "qvi-bench-model"};
  Flags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(f.threads);

  std::cerr << qvi::LoadCudaSupport() << "\n";
  absl::StatusOr<qvi::GraphBackend*> graph_backend = qvi::LoadCudaGraphBackend();
  if (f.graphs != "off" && !graph_backend.ok()) {
    std::cerr << "--cuda-graphs " << f.graphs << ": " << graph_backend.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<std::unique_ptr<qvi::Model>>> models =
      LoadModels(f, graph_backend.ok() ? *graph_backend : nullptr);
  if (!models.ok()) {
    std::cerr << models.status() << "\n";
    return 1;
  }
  const qvi::Model& model = *models->front();
  absl::StatusOr<std::vector<std::vector<int64_t>>> ids = TokenIds(model, f);
  if (!ids.ok()) return 1;
  qvi::OutputSet wanted = qvi::AnswerTensors(model.manifest().task);
  if (f.explain) wanted |= qvi::OutputsOf({qvi::Output::kAttention, qvi::Output::kGates});
  std::vector<bool> map_settings;
  if (f.maps != "on") map_settings.push_back(false);
  if (f.maps != "off") map_settings.push_back(true);
  for (const auto& m : *models) {
    std::cerr << m->format() << " (" << m->file() << "): forward without maps "
              << (m->has_forward_without_maps() ? "yes" : "no (forward always forms the maps)") << "\n";
  }
  std::printf("%6s %5s %20s %6s %8s %10s %10s %10s %10s\n", "batch", "maps", "format", "graphs", "idle us", "texts/s",
              "batches/s", "p50 ms", "p99 ms");
  nlohmann::json results = nlohmann::json::array();
  for (int bs : f.batch_sizes) {
    for (bool with_maps : map_settings) {
      qvi::OutputSet asked = wanted;
      if (with_maps) asked.set(static_cast<size_t>(qvi::Output::kLayerAttention));
      for (const auto& [m, idle] : Combinations(*models, f.idle_us)) {
        absl::StatusOr<nlohmann::json> step = MeasureStep(*m, *ids, bs, with_maps, asked, idle, f);
        if (!step.ok()) {
          std::cerr << step.status() << "\n";
          return 1;
        }
        results.push_back(*std::move(step));
      }
    }
  }
  if (!f.json.empty()) {
    std::vector<std::string> formats;
    for (const auto& m : *models) formats.push_back(m->format());
    std::ofstream(f.json) << nlohmann::json{{"model", f.path},
                                            {"formats", formats},
                                            {"device", model.device()},
                                            {"words", f.words},
                                            {"torch_threads", f.threads},
                                            {"explain", f.explain},
                                            {"idle_spin", f.idle_spin},
                                            {"forward_without_maps", model.has_forward_without_maps()},
                                            {"steps", results}}
                                 .dump(2)
                          << "\n";
  }
  return 0;
}
