#include "server/core/manifest/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("manifest.json: field '", field, "' ", what));
}

// Reads json[key] as T, or explains why not.
template <typename T>
absl::Status Get(const json& j, const char* key, const std::string& path, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return Bad(absl::StrCat(path, key), "is missing");
  try {
    out = it->template get<T>();
  } catch (const json::exception&) {
    return Bad(absl::StrCat(path, key), absl::StrCat("has the wrong type (", it->type_name(), ")"));
  }
  return absl::OkStatus();
}

#define QVI_RETURN_IF_ERROR(expr)      \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (false)

}  // namespace

namespace {

// The task and what it brings: labels, or tags in a scheme with their entity types.
absl::Status ParseTask(const json& j, Manifest& m) {
  std::string task;
  QVI_RETURN_IF_ERROR(Get(j, "task", "", task));
  if (task == "classification") {
    m.task = Task::kClassification;
    QVI_RETURN_IF_ERROR(Get(j, "labels", "", m.labels));
    if (m.labels.empty()) return Bad("labels", "is empty");
    return absl::OkStatus();
  }
  if (task != "tagging") return Bad("task", absl::StrCat("must be 'classification' or 'tagging', got '", task, "'"));
  m.task = Task::kTagging;
  QVI_RETURN_IF_ERROR(Get(j, "tags", "", m.tags));
  QVI_RETURN_IF_ERROR(Get(j, "tag_scheme", "", m.tag_scheme));
  if (m.tag_scheme != "BIO" && m.tag_scheme != "BIOES") {
    return Bad("tag_scheme", absl::StrCat("must be BIO or BIOES, got '", m.tag_scheme, "'"));
  }
  if (m.tags.empty()) return Bad("tags", "is empty");
  // Each tag is O or PREFIX-TYPE with a prefix of the scheme and a type: a tag such as "I-" would
  // make spans without a label (found by fuzz/fuzz_spans.cc).
  const std::string prefixes = m.tag_scheme == "BIO" ? "BI" : "BIES";
  for (size_t i = 0; i < m.tags.size(); ++i) {
    const std::string& t = m.tags[i];
    if (t == "O") continue;
    if (t.size() < 3 || t[1] != '-' || prefixes.find(t[0]) == std::string::npos) {
      return Bad(absl::StrCat("tags[", i, "]"),
                 absl::StrCat("is not O or one of ", m.tag_scheme, "'s ", prefixes, " prefixes, a dash and a type"));
    }
  }
  if (j.contains("entity_types")) QVI_RETURN_IF_ERROR(Get(j, "entity_types", "", m.entity_types));
  return absl::OkStatus();
}

// architecture: its names, and the layers and heads of a Transformer.
absl::Status ParseArchitecture(const json& j, Manifest& m) {
  const json* arch = j.contains("architecture") ? &j["architecture"] : nullptr;
  if (arch == nullptr || !arch->is_object()) return Bad("architecture", "is missing or not an object");
  QVI_RETURN_IF_ERROR(Get(*arch, "name", "architecture.", m.architecture));
  QVI_RETURN_IF_ERROR(Get(*arch, "display_name", "architecture.", m.display_name));
  QVI_RETURN_IF_ERROR(Get(*arch, "interaction", "architecture.", m.interaction));
  if (!arch->contains("config") || !(*arch)["config"].is_object()) return absl::OkStatus();
  const json& c = (*arch)["config"];
  // The zoo's Transformers, and the encoders `qvi import` rebuilds (hf_bert, hf_roberta, ...).
  const bool transformer =
      m.architecture.find("transformer") != std::string::npos || m.architecture.rfind("hf_", 0) == 0;
  if (c.contains("layers") && c.contains("heads") && transformer) {
    QVI_RETURN_IF_ERROR(Get(c, "layers", "architecture.config.", m.layers));
    QVI_RETURN_IF_ERROR(Get(c, "heads", "architecture.config.", m.heads));
  }
  return absl::OkStatus();
}

absl::Status ParseTokenizer(const json& j, Manifest& m) {
  const json* tok = j.contains("tokenizer") ? &j["tokenizer"] : nullptr;
  if (tok == nullptr || !tok->is_object()) return Bad("tokenizer", "is missing or not an object");
  std::string level;
  QVI_RETURN_IF_ERROR(Get(*tok, "level", "tokenizer.", level));
  if (level == "word") {
    m.tokenizer.level = TokenLevel::kWord;
  } else if (level == "char") {
    m.tokenizer.level = TokenLevel::kChar;
  } else if (level == "subword") {
    m.tokenizer.level = TokenLevel::kSubword;
    QVI_RETURN_IF_ERROR(Get(*tok, "file", "tokenizer.", m.tokenizer_file));
    // The name the artifact's loaders read it under (model.pt's and the packages' extra files).
    if (m.tokenizer_file != "tokenizer.json") {
      return Bad("tokenizer.file", absl::StrCat("must be 'tokenizer.json', got '", m.tokenizer_file, "'"));
    }
    if (tok->contains("kind")) QVI_RETURN_IF_ERROR(Get(*tok, "kind", "tokenizer.", m.tokenizer_kind));
    if (m.task == Task::kTagging) {
      QVI_RETURN_IF_ERROR(Get(*tok, "word_tags", "tokenizer.", m.word_tags));
      if (m.word_tags != "first_subword") {
        return Bad("tokenizer.word_tags", absl::StrCat("must be 'first_subword', got '", m.word_tags, "'"));
      }
    }
  } else {
    return Bad("tokenizer.level", absl::StrCat("must be 'word', 'char' or 'subword', got '", level, "'"));
  }
  QVI_RETURN_IF_ERROR(Get(*tok, "lowercase", "tokenizer.", m.tokenizer.lowercase));
  QVI_RETURN_IF_ERROR(Get(*tok, "max_tokens", "tokenizer.", m.tokenizer.max_tokens));
  if (m.tokenizer.max_tokens < 1) return Bad("tokenizer.max_tokens", "must be at least 1");
  if (tok->contains("casing")) QVI_RETURN_IF_ERROR(Get(*tok, "casing", "tokenizer.", m.tokenizer.casing));
  return Get(*tok, "vocab_size", "tokenizer.", m.vocab_size);
}

// outputs (with the ones its task cannot do without) and explanations.
absl::Status ParseOutputs(const json& j, Manifest& m) {
  const json* outputs = j.contains("outputs") ? &j["outputs"] : nullptr;
  if (outputs == nullptr || !outputs->is_object()) return Bad("outputs", "is missing or not an object");
  for (const auto& [name, spec] : outputs->items()) {
    std::vector<std::string> shape;
    QVI_RETURN_IF_ERROR(Get(spec, "shape", absl::StrCat("outputs.", name, "."), shape));
    m.outputs[name] = shape;
  }
  const char* required = m.task == Task::kClassification ? "logits" : "tags";
  if (!m.HasOutput(required)) return Bad("outputs", absl::StrCat("lacks '", required, "'"));
  if (m.task == Task::kTagging && !m.HasOutput("emissions")) return Bad("outputs", "lacks 'emissions'");
  if (j.contains("explanations")) QVI_RETURN_IF_ERROR(Get(j, "explanations", "", m.explanations));
  return absl::OkStatus();
}

absl::Status ParseEstimate(const json& j, const std::string& path, Estimate& e) {
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "mean", path + ".", e.mean));
  QVI_RETURN_IF_ERROR(Get(j, "low", path + ".", e.low));
  return Get(j, "high", path + ".", e.high);
}

absl::Status ParseMethodCost(const json& j, const std::string& path, MethodCost& c) {
  if (!j.is_object()) return Bad(path, "is not an object");
  for (auto [key, out] : {std::pair{"ms_per_text_batch_1", &c.ms_per_text_batch_1},
                          std::pair{"ms_per_text_batch_32", &c.ms_per_text_batch_32},
                          std::pair{"extra_forwards_per_text", &c.extra_forwards_per_text}}) {
    QVI_RETURN_IF_ERROR(Get(j, key, path + ".", *out));
    if (!(*out >= 0)) return Bad(absl::StrCat(path, ".", key), "must be a number at least 0");
  }
  return absl::OkStatus();
}

absl::Status ParseMethodFaithfulness(const json& j, const std::string& path, MethodFaithfulness& m) {
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "method", path + ".", m.method));
  QVI_RETURN_IF_ERROR(Get(j, "name", path + ".", m.name));
  for (auto [key, out] :
       {std::pair{"comprehensiveness", &m.comprehensiveness}, std::pair{"sufficiency", &m.sufficiency},
        std::pair{"normalised_comprehensiveness", &m.normalised_comprehensiveness}}) {
    if (!j.contains(key)) return Bad(absl::StrCat(path, ".", key), "is missing");
    QVI_RETURN_IF_ERROR(ParseEstimate(j[key], absl::StrCat(path, ".", key), *out));
  }
  if (j.contains("loo_spearman")) {
    QVI_RETURN_IF_ERROR(ParseEstimate(j["loo_spearman"], path + ".loo_spearman", m.loo_spearman.emplace()));
  }
  if (j.contains("vs_random")) {
    QVI_RETURN_IF_ERROR(ParseEstimate(j["vs_random"], path + ".vs_random", m.vs_random.emplace()));
    QVI_RETURN_IF_ERROR(Get(j["vs_random"], "p", path + ".vs_random.", m.vs_random_p));
  }
  if (j.contains("cost")) QVI_RETURN_IF_ERROR(ParseMethodCost(j["cost"], path + ".cost", m.cost.emplace()));
  return absl::OkStatus();
}

// model_card.faithfulness: a card written by an exporter without it simply has none.
absl::Status ParseFaithfulness(const json& j, FaithfulnessCard& f) {
  const std::string path = "model_card.faithfulness";
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "split", path + ".", f.split));
  QVI_RETURN_IF_ERROR(Get(j, "answers", path + ".", f.answers));
  QVI_RETURN_IF_ERROR(Get(j, "texts", path + ".", f.texts));
  QVI_RETURN_IF_ERROR(Get(j, "removal", path + ".", f.removal));
  QVI_RETURN_IF_ERROR(Get(j, "target", path + ".", f.target));
  QVI_RETURN_IF_ERROR(Get(j, "ks", path + ".", f.ks));
  if (j.contains("cost_machine")) QVI_RETURN_IF_ERROR(Get(j, "cost_machine", path + ".", f.cost_machine));
  if (!j.contains("methods") || !j["methods"].is_array()) return Bad(path + ".methods", "is missing or not a list");
  for (size_t i = 0; i < j["methods"].size(); ++i) {
    QVI_RETURN_IF_ERROR(
        ParseMethodFaithfulness(j["methods"][i], absl::StrCat(path, ".methods[", i, "]"), f.methods.emplace_back()));
  }
  return absl::OkStatus();
}

// model_card.calibration: a card without it answers raw scores.
absl::Status ParseCalibration(const json& j, CalibrationCard& c) {
  const std::string path = "model_card.calibration";
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "temperature", path + ".", c.temperature));
  if (!std::isfinite(c.temperature) || c.temperature <= 0) return Bad(path + ".temperature", "must be above 0");
  QVI_RETURN_IF_ERROR(Get(j, "fitted_on", path + ".", c.fitted_on));
  QVI_RETURN_IF_ERROR(Get(j, "measured_on", path + ".", c.measured_on));
  for (const char* side : {"before", "after"}) {
    if (!j.contains(side) || !j[side].is_object()) return Bad(absl::StrCat(path, ".", side), "is missing");
    const std::string prefix = absl::StrCat(path, ".", side, ".");
    const bool before = std::string_view(side) == "before";
    QVI_RETURN_IF_ERROR(Get(j[side], "ece", prefix, before ? c.ece_before : c.ece_after));
    QVI_RETURN_IF_ERROR(Get(j[side], "brier", prefix, before ? c.brier_before : c.brier_after));
  }
  if (!j.contains("conformal")) return absl::OkStatus();
  if (!j["conformal"].is_array()) return Bad(path + ".conformal", "is not a list");
  for (size_t i = 0; i < j["conformal"].size(); ++i) {
    const std::string prefix = absl::StrCat(path, ".conformal[", i, "].");
    ConformalLevel& level = c.conformal.emplace_back();
    QVI_RETURN_IF_ERROR(Get(j["conformal"][i], "coverage_target", prefix, level.coverage_target));
    QVI_RETURN_IF_ERROR(Get(j["conformal"][i], "min_probability", prefix, level.min_probability));
    QVI_RETURN_IF_ERROR(Get(j["conformal"][i], "coverage", prefix, level.coverage));
    if (!(level.coverage_target > 0 && level.coverage_target < 1)) {
      return Bad(prefix + "coverage_target", "must be in (0, 1)");
    }
    if (!(level.min_probability >= 0 && level.min_probability <= 1)) {
      return Bad(prefix + "min_probability", "must be in [0, 1]");
    }
  }
  std::sort(c.conformal.begin(), c.conformal.end(),
            [](const ConformalLevel& a, const ConformalLevel& b) { return a.coverage_target < b.coverage_target; });
  return absl::OkStatus();
}

absl::Status ParseBinned(const json& j, const std::string& path, bool probabilities, BinnedShares& b) {
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "edges", path + ".", b.edges));
  QVI_RETURN_IF_ERROR(Get(j, "shares", path + ".", b.shares));
  if (b.shares.size() != b.edges.size() + 1) {
    return Bad(path + ".shares", absl::StrCat("has ", b.shares.size(), " bins; its ", b.edges.size(), " edges make ",
                                              b.edges.size() + 1));
  }
  for (size_t i = 0; i < b.edges.size(); ++i) {
    if (!std::isfinite(b.edges[i]) || (i > 0 && b.edges[i] <= b.edges[i - 1]) ||
        (probabilities && (b.edges[i] < 0 || b.edges[i] > 1))) {
      return Bad(absl::StrCat(path, ".edges[", i, "]"),
                 probabilities ? "must be in [0, 1] and above the one before" : "must be above the one before");
    }
  }
  for (size_t i = 0; i < b.shares.size(); ++i) {
    if (!(b.shares[i] >= 0 && b.shares[i] <= 1))
      return Bad(absl::StrCat(path, ".shares[", i, "]"), "must be in [0, 1]");
  }
  return absl::OkStatus();
}

// model_card.drift_reference: a card without it has no drift gauges.
absl::Status ParseDriftReference(const json& j, DriftReference& d) {
  const std::string path = "model_card.drift_reference";
  if (!j.is_object()) return Bad(path, "is not an object");
  QVI_RETURN_IF_ERROR(Get(j, "split", path + ".", d.split));
  QVI_RETURN_IF_ERROR(Get(j, "texts", path + ".", d.texts));
  QVI_RETURN_IF_ERROR(Get(j, "labels", path + ".", d.labels));
  for (const auto& [label, share] : d.labels) {
    if (!(share >= 0 && share <= 1)) return Bad(absl::StrCat(path, ".labels.", label), "must be in [0, 1]");
  }
  QVI_RETURN_IF_ERROR(Get(j, "unknown", path + ".", d.unknown));
  if (!(d.unknown >= 0 && d.unknown <= 1)) return Bad(path + ".unknown", "must be in [0, 1]");
  if (!j.contains("length")) return Bad(path + ".length", "is missing");
  QVI_RETURN_IF_ERROR(ParseBinned(j["length"], path + ".length", false, d.length));
  if (!j.contains("confidence")) return Bad(path + ".confidence", "is missing");
  QVI_RETURN_IF_ERROR(ParseBinned(j["confidence"], path + ".confidence", true, d.confidence));
  QVI_RETURN_IF_ERROR(Get(j["confidence"], "temperature", path + ".confidence.", d.temperature));
  if (!(d.temperature > 0) || !std::isfinite(d.temperature))
    return Bad(path + ".confidence.temperature", "must be above 0");
  if (!j.contains("below") || !j["below"].is_object()) return Bad(path + ".below", "is missing");
  QVI_RETURN_IF_ERROR(Get(j["below"], "threshold", path + ".below.", d.below_threshold));
  QVI_RETURN_IF_ERROR(Get(j["below"], "share", path + ".below.", d.below_share));
  if (!(d.below_threshold > 0 && d.below_threshold <= 1)) return Bad(path + ".below.threshold", "must be in (0, 1]");
  if (!(d.below_share >= 0 && d.below_share <= 1)) return Bad(path + ".below.share", "must be in [0, 1]");
  return absl::OkStatus();
}

// One batching block (the manifest's `serving`, or its `cuda`): the keys it has, over `b`'s values.
absl::Status ParseBatching(const json& s, const char* prefix, BatchingDefaults& b) {
  if (s.contains("max_batch_size")) QVI_RETURN_IF_ERROR(Get(s, "max_batch_size", prefix, b.max_batch_size));
  if (s.contains("max_batch_tokens")) QVI_RETURN_IF_ERROR(Get(s, "max_batch_tokens", prefix, b.max_batch_tokens));
  if (s.contains("max_queue_delay_ms")) QVI_RETURN_IF_ERROR(Get(s, "max_queue_delay_ms", prefix, b.max_queue_delay_ms));
  return absl::OkStatus();
}

// The optional parts: the batching the model suggests, and its model card.
absl::Status ParseServingAndCard(const json& j, Manifest& m) {
  if (j.contains("serving") && j["serving"].is_object()) {
    const json& s = j["serving"];
    QVI_RETURN_IF_ERROR(ParseBatching(s, "serving.", m.serving));
    if (s.contains("cuda")) {
      if (!s["cuda"].is_object()) return Bad("serving.cuda", "must be an object");
      QVI_RETURN_IF_ERROR(ParseBatching(s["cuda"], "serving.cuda.", m.serving_cuda.emplace(GpuBatchingDefaults())));
    }
  }
  if (j.contains("model_card")) {
    m.model_card_json = j["model_card"].dump();
    const json& card = j["model_card"];
    if (card.is_object() && card.contains("description") && card["description"].is_string()) {
      m.description = card["description"].get<std::string>();
    }
    if (card.is_object() && card.contains("faithfulness")) {
      QVI_RETURN_IF_ERROR(ParseFaithfulness(card["faithfulness"], m.faithfulness.emplace()));
    }
    if (card.is_object() && card.contains("calibration")) {
      QVI_RETURN_IF_ERROR(ParseCalibration(card["calibration"], m.calibration.emplace()));
    }
    if (card.is_object() && card.contains("drift_reference")) {
      QVI_RETURN_IF_ERROR(ParseDriftReference(card["drift_reference"], m.drift_reference.emplace()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> Manifest::Parse(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("manifest.json is not a JSON object");
  }
  Manifest m;
  int format = 0;
  QVI_RETURN_IF_ERROR(Get(j, "format_version", "", format));
  if (format < 1 || format > kFormatVersion) {
    return Bad("format_version", absl::StrCat("is ", format, "; this server reads versions 1 to ", kFormatVersion));
  }
  QVI_RETURN_IF_ERROR(Get(j, "name", "", m.name));
  // In the order the checks always ran: the first problem found is the one reported.
  for (auto* part : {&ParseTask, &ParseArchitecture, &ParseTokenizer, &ParseOutputs, &ParseServingAndCard}) {
    QVI_RETURN_IF_ERROR(part(j, m));
  }
  if (m.subwords() && format < 2) return Bad("tokenizer.level", "'subword' needs format_version 2");
  return m;
}

}  // namespace qvi
