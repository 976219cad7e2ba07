// Metrics of the models' memory (guarantee 9 of model_repository.h): each version's footprint, and
// the loads and evictions by reason.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>

#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"

namespace qvi {

Metrics::ModelMemory::ModelMemory(prometheus::Registry& registry)
    : bytes(prometheus::BuildGauge()
                .Name("qvi_model_memory_bytes")
                .Help("Each loaded version's footprint on its device, as the memory budget counts it (measured "
                      "at load, or serving.json's memory_bytes)")
                .Register(registry)),
      loads(prometheus::BuildCounter()
                .Name("qvi_model_loads_total")
                .Help("Models loaded, by reason: poll (the store), admin (a repository load call), demand (a "
                      "request, --load-on-demand)")
                .Register(registry)),
      evictions(prometheus::BuildCounter()
                    .Name("qvi_model_evictions_total")
                    .Help("Models unloaded to save memory, by reason: budget (room for another, least recently "
                          "used first), idle (--unload-idle-after)")
                    .Register(registry)) {}

void Metrics::SetModelMemory(const std::string& model, const VersionStatus& status) {
  const std::pair<std::string, int64_t> key{model, status.version};
  auto it = memory_.find(key);
  if (it != memory_.end()) {
    model_memory_.bytes.Remove(it->second);
    memory_.erase(it);
  }
  const bool loaded = status.state == ModelState::kReady || status.state == ModelState::kUnloading;
  if (!loaded || status.model == nullptr) return;
  prometheus::Gauge& gauge = model_memory_.bytes.Add(
      {{"model", model}, {"version", absl::StrCat(status.version)}, {"device", status.model->device()}});
  gauge.Set(static_cast<double>(status.memory_bytes));
  memory_.emplace(key, &gauge);
}

void Metrics::OnModelMemoryEvent(const std::string& model, bool loaded, const char* reason) {
  (loaded ? model_memory_.loads : model_memory_.evictions).Add({{"model", model}, {"reason", reason}}).Increment();
}

}  // namespace qvi
