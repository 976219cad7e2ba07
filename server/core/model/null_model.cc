#include "server/core/model/null_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/core/base/sync.h"

namespace qvi {
namespace {

// The emulated accelerator: one in-order queue, as a GPU stream is. Each batch is booked on it after
// the batches before it, for per_batch + per_text x its texts; whoever collects it sleeps until the
// device is done with it (Model::Collect): device time that costs no CPU, so that a 2-core machine
// can measure how well the engine keeps a device busy (qvi_device_busy_seconds_total), and a runner
// can launch the next batch meanwhile, as on a GPU.
class EmulatedDevice {
 public:
  EmulatedDevice(absl::Duration per_batch, absl::Duration per_text, bool asynchronous, std::string hold_file)
      : per_batch_(absl::ToChronoNanoseconds(per_batch)),
        per_text_(absl::ToChronoNanoseconds(per_text)),
        asynchronous_(asynchronous),
        hold_file_(std::move(hold_file)) {}

  // False ("asynchronous": false in device_us): the runner collects each batch before it launches
  // the next, as if the device could not queue work: the engine without its pipeline, for comparison.
  bool asynchronous() const { return asynchronous_; }

  // Queues a batch of `texts` on the device; sets its device time and the wait for its end.
  void Book(int64_t texts, ModelOutputs& out) {
    const std::chrono::nanoseconds busy = per_batch_ + per_text_ * texts;
    std::chrono::steady_clock::time_point done;
    {
      MutexLock lock(&mu_);
      done = std::max(std::chrono::steady_clock::now(), free_at_) + busy;
      free_at_ = done;
    }
    out.device_time = absl::FromChrono(busy);
    out.wait_for_device = [done, hold = hold_file_] {
      std::this_thread::sleep_until(done);
      // "hold_while_file": a test keeps the batch on the device, its end in the test's hands rather
      // than a clock's, until it removes the file (at most kMaxHold: a test that fails before removing it
      // does not hang the server).
      const auto give_up = std::chrono::steady_clock::now() + kMaxHold;
      std::error_code error;
      while (!hold.empty() && std::filesystem::exists(hold, error) && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    };
  }

 private:
  static constexpr std::chrono::seconds kMaxHold{120};
  const std::chrono::nanoseconds per_batch_, per_text_;
  const bool asynchronous_;
  const std::string hold_file_;
  Mutex mu_;
  std::chrono::steady_clock::time_point free_at_ ABSL_GUARDED_BY(mu_);
};

class NullModel final : public Model {
 public:
  NullModel(Manifest manifest, Vocabulary vocabulary, c10::Device device, std::string file,
            std::unique_ptr<EmulatedDevice> emulated)
      : Model(std::move(manifest), std::move(vocabulary), device, std::move(file)), emulated_(std::move(emulated)) {}

  std::string format() const override { return "null"; }
  bool has_forward_without_maps() const override { return true; }
  bool asynchronous() const override {
    return emulated_ != nullptr ? emulated_->asynchronous() : Model::asynchronous();
  }
  using Model::ReadSubwordTokenizer;
  using Model::WarmUp;

 protected:
  // Every output the manifest lists, shaped by its catalogue row's model shape (so that a new row needs
  // nothing here): int64 outputs (tags) and the answer's scores zero, the attention-like outputs α
  // spread evenly over a text's tokens, every gate-like one 0.5.
  ModelOutputs Run(const at::Tensor& ids, const at::Tensor& mask, bool maps) const override {
    const Manifest& m = manifest();
    const int64_t b = ids.size(0), t = ids.size(1);
    const auto on = ids.options().dtype(at::kFloat);
    const at::Tensor real = mask.to(at::kFloat);
    const at::Tensor uniform = real / real.sum(1, /*keepdim=*/true).clamp_min(1.0);  // α: 1/n per token
    const at::Tensor half = real * 0.5;
    ModelOutputs out;
    for (const auto& [name, shape] : m.outputs) {
      const std::optional<Output> o = OutputNamed(name);
      if (!o || Row(*o).model_shape == nullptr) continue;
      const OutputRow& row = Row(*o);
      if (row.on == OutputSwitch::kLayerAttention && !maps) continue;
      const std::vector<int64_t> sizes = Sizes(row.model_shape, m, b, t);
      if (row.model_int64) {
        out[*o] = at::zeros(sizes, ids.options().dtype(at::kLong));
      } else if (row.kind == OutputKind::kAnswer) {
        out[*o] = at::zeros(sizes, on);
      } else {
        // [B, T] values broadcast over the other dimensions (layers, heads, query tokens, labels).
        std::vector<int64_t> view(sizes.size(), 1);
        view.front() = b;
        view[TokenDimension(row.model_shape)] = t;
        const bool attention = row.on == OutputSwitch::kAttention || row.on == OutputSwitch::kLayerAttention;
        out[*o] = (attention ? uniform : half).view(view).expand(sizes);
      }
    }
    if (emulated_ != nullptr) emulated_->Book(b, out);
    return out;
  }

 private:
  // Where the last T of a catalogue shape is ("B,L,H,T,T": 4; "B,T,C": 1).
  static size_t TokenDimension(const char* shape) {
    const std::vector<absl::string_view> dims = absl::StrSplit(shape, ',');
    size_t at = dims.size() - 1;
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == "T") at = d;
    }
    return at;
  }

  // The sizes of a catalogue shape ("B,L,H,T") for this batch and this model.
  static std::vector<int64_t> Sizes(const char* shape, const Manifest& m, int64_t b, int64_t t) {
    std::vector<int64_t> sizes;
    for (absl::string_view d : absl::StrSplit(shape, ',')) {
      if (d == "B") sizes.push_back(b);
      if (d == "T") sizes.push_back(t);
      if (d == "C") sizes.push_back(static_cast<int64_t>(m.labels.size()));
      if (d == "K") sizes.push_back(static_cast<int64_t>(m.tags.size()));
      if (d == "L") sizes.push_back(m.layers);
      if (d == "H") sizes.push_back(m.heads);
    }
    return sizes;
  }

  const std::unique_ptr<EmulatedDevice> emulated_;  // null: no device time
};

// model.null's "device_us": {"per_batch": µs, "per_text": µs, "asynchronous": bool, "hold_while_file":
// path}, all optional (0, 0, true, none), each time at most 10 s.
absl::StatusOr<std::unique_ptr<EmulatedDevice>> ParseDeviceTime(const nlohmann::json& file, const std::string& path) {
  if (!file.contains("device_us")) return nullptr;
  const nlohmann::json& d = file["device_us"];
  if (!d.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": device_us is an object {\"per_batch\": µs, \"per_text\": µs, \"asynchronous\": true, "
                     "\"hold_while_file\": path}"));
  }
  std::string hold_file;
  constexpr double kMaxUs = 10e6;
  double us[2] = {0, 0};
  bool asynchronous = true;
  const char* names[2] = {"per_batch", "per_text"};
  for (const auto& item : d.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == "asynchronous") {
      if (!value.is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": device_us.asynchronous must be true or false"));
      }
      asynchronous = value.get<bool>();
      continue;
    }
    if (key == "hold_while_file") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": device_us.hold_while_file must be a file's path"));
      }
      hold_file = value.get<std::string>();
      continue;
    }
    const auto* name = std::find_if(std::begin(names), std::end(names), [&](const char* n) { return key == n; });
    if (name == std::end(names)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": device_us.", key, " is not a field (per_batch, per_text, asynchronous, hold_while_file)"));
    }
    if (!value.is_number() || value.get<double>() < 0 || value.get<double>() > kMaxUs) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": device_us.", key, " must be a number of microseconds from 0 to 10000000"));
    }
    us[name - std::begin(names)] = value.get<double>();
  }
  return std::make_unique<EmulatedDevice>(absl::Microseconds(us[0]), absl::Microseconds(us[1]), asynchronous,
                                          std::move(hold_file));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadNullModel(const std::string& path, const c10::Device& device) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  const nlohmann::json file = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!file.is_object() || !file.contains("manifest") || !file["manifest"].is_object() || !file.contains("vocab") ||
      !file["vocab"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a null model is a JSON object {\"manifest\": {...}, \"vocab\": [tokens]}"));
  }
  std::vector<std::string> tokens;
  for (const nlohmann::json& token : file["vocab"]) {
    if (!token.is_string()) return absl::InvalidArgumentError(absl::StrCat(path, ": vocab holds a non-string"));
    tokens.push_back(token.get<std::string>());
  }
  absl::StatusOr<std::unique_ptr<EmulatedDevice>> emulated = ParseDeviceTime(file, path);
  if (!emulated.ok()) return emulated.status();
  absl::StatusOr<std::pair<Manifest, Vocabulary>> files =
      ParseArtifactFiles(file["manifest"].dump(), absl::StrJoin(tokens, "\n") + "\n", path);
  if (!files.ok()) return files.status();
  auto model = std::make_unique<NullModel>(std::move(files->first), std::move(files->second), device, path,
                                           std::move(*emulated));
  // A sub-word model's tokenizer.json, as a string under "tokenizer".
  const std::string tokenizer =
      file.contains("tokenizer") && file["tokenizer"].is_string() ? file["tokenizer"].get<std::string>() : "";
  if (absl::Status s = model->ReadSubwordTokenizer(tokenizer); !s.ok()) return s;
  if (absl::Status s = model->WarmUp(); !s.ok()) return s;
  return model;
}

}  // namespace qvi
