#include "server/core/manifest/serving_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/manifest/shape_buckets.h"

namespace qvi {
namespace {

absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("serving.json: '", key, "' ", what));
}

template <typename T>
absl::Status ReadNumber(const nlohmann::json& value, const std::string& key, T min, T max, std::optional<T>& out) {
  if (!value.is_number()) return Bad(key, "must be a number");
  const double v = value.get<double>();
  if (v < static_cast<double>(min) || v > static_cast<double>(max) ||
      (std::is_integral_v<T> && v != static_cast<double>(static_cast<int64_t>(v)))) {
    return Bad(key, absl::StrCat("must be ", std::is_integral_v<T> ? "an integer " : "", "in [", min, ", ", max,
                                 "], got ", value.dump()));
  }
  out = static_cast<T>(v);
  return absl::OkStatus();
}

// "cuda_graphs": a boolean, or an object with enabled, batch_sizes and lengths (each optional). The
// lists are checked against the model's maxima when it loads (ShapeBuckets::Check).
absl::StatusOr<GraphSettings> ParseGraphSettings(const nlohmann::json& value) {
  GraphSettings g;
  if (value.is_boolean()) {
    g.enabled = value.get<bool>();
    return g;
  }
  const std::string key = "cuda_graphs";
  if (!value.is_object()) {
    return Bad(key, "must be true, false or {\"enabled\": ..., \"batch_sizes\": [...], \"lengths\": [...]}");
  }
  for (const auto& [field, v] : value.items()) {
    if (field == "enabled") {
      if (!v.is_boolean()) return Bad(key + ".enabled", "must be true or false");
      g.enabled = v.get<bool>();
    } else if (field == "batch_sizes" || field == "lengths") {
      std::vector<int64_t>& list = field == "lengths" ? g.lengths : g.batch_sizes;
      if (!v.is_array() || v.empty() || v.size() > ShapeBuckets::kMaxBuckets) {
        return Bad(key + "." + field, absl::StrCat("must be a list of 1 to ", ShapeBuckets::kMaxBuckets, " integers"));
      }
      for (const nlohmann::json& item : v) {
        std::optional<int64_t> n;
        if (absl::Status s = ReadNumber<int64_t>(item, key + "." + field, 1, 1 << 16, n); !s.ok()) return s;
        if (!list.empty() && *n <= list.back()) {
          return Bad(key + "." + field, absl::StrCat("must be strictly ascending; ", *n, " follows ", list.back()));
        }
        list.push_back(*n);
      }
    } else {
      return Bad(key + "." + field, "is not a cuda_graphs setting; allowed: enabled, batch_sizes, lengths");
    }
  }
  return g;
}

}  // namespace

absl::StatusOr<VersionPolicy> VersionPolicy::Parse(const std::string& spec) {
  auto bad = [&spec](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("version policy '", spec, "' ", why, "; use latest:N, all or specific:V1,V2,..."));
  };
  VersionPolicy p;
  if (spec == "all") {
    p.kind = Kind::kAll;
    return p;
  }
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "latest") {
    if (!absl::SimpleAtoi(rest, &p.latest) || p.latest < 1 || p.latest > 1000) {
      return bad("needs a count N in [1, 1000]");
    }
    return p;
  }
  if (kind == "specific") {
    p.kind = Kind::kSpecific;
    for (const std::string& v : std::vector<std::string>(absl::StrSplit(rest, ','))) {
      int64_t number = 0;
      if (!absl::SimpleAtoi(v, &number) || number < 1)
        return bad(absl::StrCat("has '", v, "', which is not a version >= 1"));
      p.versions.push_back(number);
    }
    std::sort(p.versions.begin(), p.versions.end());
    p.versions.erase(std::unique(p.versions.begin(), p.versions.end()), p.versions.end());
    return p;
  }
  return bad("is not known");
}

std::string VersionPolicy::ToString() const {
  switch (kind) {
    case Kind::kLatest:
      return absl::StrCat("latest:", latest);
    case Kind::kAll:
      return "all";
    case Kind::kSpecific:
      return absl::StrCat("specific:", absl::StrJoin(versions, ","));
  }
  return "";
}

absl::StatusOr<ShadowSettings> ParseShadowSettings(const nlohmann::json& j, const std::string& source) {
  const auto bad = [&](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": '", key, "' ", what));
  };
  if (!j.is_object()) return bad("shadow", "must be an object: {\"version\": 2, \"fraction\": 0.1}");
  ShadowSettings s;
  std::optional<int64_t> version;
  std::optional<double> fraction;
  for (const auto& [key, value] : j.items()) {
    if (key == "version") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1)
        return bad("shadow.version", "must be a version, 1 or more");
      version = value.get<int64_t>();
    } else if (key == "fraction") {
      if (!value.is_number() || !(value.get<double>() > 0 && value.get<double>() <= 1)) {
        return bad("shadow.fraction", "must be in (0, 1]: the share of texts mirrored");
      }
      fraction = value.get<double>();
    } else if (key == "keep_texts") {
      if (!value.is_boolean()) return bad("shadow.keep_texts", "must be true or false");
      s.keep_texts = value.get<bool>();
    } else {
      return bad(absl::StrCat("shadow.", key), "is not a shadow setting; allowed: version, fraction, keep_texts");
    }
  }
  if (!version) return bad("shadow.version", "is missing: the candidate version to mirror texts to");
  if (!fraction) return bad("shadow.fraction", "must be in (0, 1]: the share of texts mirrored");
  s.version = *version;
  s.fraction = *fraction;
  return s;
}

absl::StatusOr<ServingOverrides> ServingOverrides::Parse(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("serving.json is not a JSON object");
  ServingOverrides o;
  for (const auto& [key, value] : j.items()) {
    absl::Status s;
    if (key == "max_batch_size") {
      s = ReadNumber(value, key, 1, 1 << 16, o.max_batch_size);
    } else if (key == "max_batch_tokens") {
      s = ReadNumber(value, key, 1, 1 << 24, o.max_batch_tokens);
    } else if (key == "max_queued_texts") {
      s = ReadNumber(value, key, 1, 1 << 24, o.max_queued_texts);
    } else if (key == "max_queued_tokens") {
      s = ReadNumber<int64_t>(value, key, 1, int64_t{1} << 32, o.max_queued_tokens);
    } else if (key == "memory_bytes") {
      s = ReadNumber<int64_t>(value, key, 1, int64_t{1} << 50, o.memory_bytes);
    } else if (key == "instances") {
      s = ReadNumber(value, key, 1, 64, o.instances);
    } else if (key == "max_queue_delay_ms") {
      s = ReadNumber(value, key, 0.0, 60000.0, o.max_queue_delay_ms);
    } else if (key == "priority_aging_ms") {
      s = ReadNumber(value, key, 0.0, 3600000.0, o.priority_aging_ms);
    } else if (key == "device") {
      if (!value.is_string()) return Bad(key, "must be a string such as \"cpu\" or \"cuda:0\"");
      o.device = value.get<std::string>();
    } else if (key == "format") {
      if (!value.is_string()) return Bad(key, "must be a string: \"auto\", \"torchscript\" or \"pt2\"");
      absl::StatusOr<ModelFormat> format = ParseModelFormat(value.get<std::string>());
      if (!format.ok()) {
        return Bad(key, absl::StrCat("is '", value.get<std::string>(), "'; allowed: auto, torchscript, pt2"));
      }
      o.format = *format;
    } else if (key == "cpu_package") {
      if (!value.is_string() || !CheckCpuPackage(value.get<std::string>()).ok()) {
        return Bad(key, absl::StrCat("must be \"auto\", \"", absl::StrJoin(kCpuPackages, "\", \""),
                                     "\" (\"base\" is model.cpu.pt2)"));
      }
      o.cpu_package = value.get<std::string>();
    } else if (key == "batch_when_idle") {
      if (!value.is_boolean()) return Bad(key, "must be true or false");
      o.batching = value.get<bool>() ? BatchingMode::kWhenIdle : BatchingMode::kFillOrDelay;
    } else if (key == "cuda_graphs") {
      absl::StatusOr<GraphSettings> graphs = ParseGraphSettings(value);
      if (!graphs.ok()) return graphs.status();
      o.cuda_graphs = *std::move(graphs);
    } else if (key == "abstain_below") {
      s = ReadNumber(value, key, 0.0, 1.0, o.abstain_below);
    } else if (key == "shadow") {
      absl::StatusOr<ShadowSettings> shadow = ParseShadowSettings(value, "serving.json");
      if (!shadow.ok()) return shadow.status();
      o.shadow = *shadow;
    } else if (key == "version_policy") {
      if (!value.is_string()) return Bad(key, "must be a string: \"latest:N\", \"all\" or \"specific:V1,V2\"");
      absl::StatusOr<VersionPolicy> policy = VersionPolicy::Parse(value.get<std::string>());
      if (!policy.ok()) return Bad(key, std::string(policy.status().message()));
      o.version_policy = *policy;
    } else {
      return Bad(key,
                 "is not a serving setting; allowed: max_batch_size, max_batch_tokens, max_queue_delay_ms, "
                 "max_queued_texts, max_queued_tokens, priority_aging_ms, instances, device, format, cpu_package, "
                 "version_policy, batch_when_idle, cuda_graphs, memory_bytes, abstain_below, shadow");
    }
    if (!s.ok()) return s;
  }
  return o;
}

absl::StatusOr<ServingOverrides> ServingOverrides::Read(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "serving.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ServingOverrides{};
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
  return Parse(text.str());
}

Placement ResolvePlacement(const ServingConfig& d, const ServingOverrides& o) {
  return Placement{o.device.value_or(d.device), o.format.value_or(d.format), o.instances.value_or(d.instances),
                   o.cpu_package.value_or(d.cpu_package)};
}

ServingConfig ResolveServingConfig(const ServingConfig& d, const Manifest& m, const ServingOverrides& o, bool on_gpu) {
  ServingConfig c = d;
  const Placement p = ResolvePlacement(d, o);
  c.device = p.device;
  c.format = p.format;
  c.cpu_package = p.cpu_package;
  c.instances = p.instances;
  const BatchingDefaults suggested = on_gpu ? m.serving_cuda.value_or(GpuBatchingDefaults()) : m.serving;
  c.max_batch_size = o.max_batch_size.value_or(suggested.max_batch_size);
  c.max_batch_tokens = o.max_batch_tokens.value_or(suggested.max_batch_tokens);
  c.max_queue_delay_ms = o.max_queue_delay_ms.value_or(suggested.max_queue_delay_ms);
  const int queued_texts = on_gpu ? defaults::kGpuMaxQueuedTexts : defaults::kMaxQueuedTexts;
  const int64_t queued_tokens = on_gpu ? defaults::kGpuMaxQueuedTokens : defaults::kMaxQueuedTokens;
  c.max_queued_texts = o.max_queued_texts.value_or(d.max_queued_texts > 0 ? d.max_queued_texts : queued_texts);
  c.max_queued_tokens = o.max_queued_tokens.value_or(d.max_queued_tokens > 0 ? d.max_queued_tokens : queued_tokens);
  c.priority_aging_ms = o.priority_aging_ms.value_or(d.priority_aging_ms);
  c.batching = o.batching.value_or(d.batching);
  c.cuda_graphs = o.cuda_graphs.value_or(d.cuda_graphs);
  c.abstain_below = o.abstain_below;
  return c;
}

absl::Status CheckServingFor(const ServingConfig& c, const Manifest& m) {
  if (c.abstain_below && !m.calibration) {
    return absl::FailedPreconditionError(
        absl::StrCat("serving.json: 'abstain_below' judges calibrated probabilities, and model '", m.name,
                     "' has no calibration on its card (`python -m qvi calibrate --write` adds one)"));
  }
  return absl::OkStatus();
}

absl::Status CheckCpuPackage(const std::string& name) {
  if (name == "auto") return absl::OkStatus();
  for (const char* known : kCpuPackages) {
    if (name == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cpu package '", name, "' is not auto, ", absl::StrJoin(kCpuPackages, ", ")));
}

std::string CpuPackageFile(const std::string& name) {
  return name == "base" ? "model.cpu.pt2" : absl::StrCat("model.cpu.", name, ".pt2");
}

const char* ModelFormatName(ModelFormat format) {
  switch (format) {
    case ModelFormat::kAuto:
      return "auto";
    case ModelFormat::kTorchScript:
      return "torchscript";
    case ModelFormat::kPt2:
      return "pt2";
  }
  return "?";
}

absl::StatusOr<ModelFormat> ParseModelFormat(const std::string& name) {
  for (ModelFormat f : {ModelFormat::kAuto, ModelFormat::kTorchScript, ModelFormat::kPt2}) {
    if (name == ModelFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat("model format '", name, "' is not auto, torchscript or pt2"));
}

}  // namespace qvi
