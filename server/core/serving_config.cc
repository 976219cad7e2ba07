#include "server/core/serving_config.h"

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
    } else if (key == "instances") {
      s = ReadNumber(value, key, 1, 64, o.instances);
    } else if (key == "max_queue_delay_ms") {
      s = ReadNumber(value, key, 0.0, 60000.0, o.max_queue_delay_ms);
    } else if (key == "device") {
      if (!value.is_string()) return Bad(key, "must be a string such as \"cpu\" or \"cuda:0\"");
      o.device = value.get<std::string>();
    } else if (key == "format") {
      if (!value.is_string()) return Bad(key, "must be a string: \"auto\", \"torchscript\" or \"pt2\"");
      if (!CheckModelFormat(value.get<std::string>()).ok()) {
        return Bad(key, absl::StrCat("is '", value.get<std::string>(), "'; allowed: auto, torchscript, pt2"));
      }
      o.format = value.get<std::string>();
    } else if (key == "batch_when_idle") {
      if (!value.is_boolean()) return Bad(key, "must be true or false");
      o.batch_when_idle = value.get<bool>();
    } else if (key == "version_policy") {
      if (!value.is_string()) return Bad(key, "must be a string: \"latest:N\", \"all\" or \"specific:V1,V2\"");
      absl::StatusOr<VersionPolicy> policy = VersionPolicy::Parse(value.get<std::string>());
      if (!policy.ok()) return Bad(key, std::string(policy.status().message()));
      o.version_policy = *policy;
    } else {
      return Bad(key,
                 "is not a serving setting; allowed: max_batch_size, max_batch_tokens, max_queue_delay_ms, "
                 "max_queued_texts, max_queued_tokens, instances, device, format, version_policy, batch_when_idle");
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

ServingConfig ResolveServingConfig(const ServingConfig& d, const Manifest& m, const ServingOverrides& o) {
  ServingConfig c = d;
  c.max_batch_size = o.max_batch_size.value_or(m.serving.max_batch_size);
  c.max_batch_tokens = o.max_batch_tokens.value_or(m.serving.max_batch_tokens);
  c.max_queue_delay_ms = o.max_queue_delay_ms.value_or(m.serving.max_queue_delay_ms);
  c.max_queued_texts = o.max_queued_texts.value_or(d.max_queued_texts);
  c.max_queued_tokens = o.max_queued_tokens.value_or(d.max_queued_tokens);
  c.instances = o.instances.value_or(d.instances);
  c.batch_when_idle = o.batch_when_idle.value_or(d.batch_when_idle);
  c.device = o.device.value_or(d.device);
  c.format = o.format.value_or(d.format);
  return c;
}

absl::Status CheckModelFormat(const std::string& format) {
  if (format == "auto" || format == "torchscript" || format == "pt2") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model format '", format, "' is not auto, torchscript or pt2"));
}

}  // namespace qvi
