#include "server/grpc/oip_convert.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace qvi::oip {
namespace {

constexpr char kInput[] = "text";

// The per-token explanation outputs: the output's name is the model's own output name, except
// that gates are "gates" in both.
constexpr const char* kTokenExplanations[] = {"attention",      "gates",    "sentence_attention",
                                              "sentence_gates", "lambda_q", "lambda_k"};
constexpr const char* kLayerOutputs[] = {"layer_gates", "layer_lambda_q", "layer_lambda_k", "layer_attention"};

// Whether `name` is one of `names`.
bool IsOneOf(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// The request-level parameters ModelInfer reads.
const std::set<std::string>& KnownParameters() {
  static const std::set<std::string> known = {"top_k",       "attention",       "gates",      "tokens",
                                              "layer_gates", "layer_attention", "truncation", "layers",
                                              "heads",       "reduction",       "timeout"};
  return known;
}

absl::Status ParameterType(const std::string& name, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("parameters.", name, ": must be ", want));
}

absl::StatusOr<bool> BoolParameter(const std::string& name, const inference::InferParameter& p) {
  if (p.parameter_choice_case() != inference::InferParameter::kBoolParam) return ParameterType(name, "a bool");
  return p.bool_param();
}

absl::StatusOr<int64_t> IntParameter(const std::string& name, const inference::InferParameter& p) {
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param) return p.int64_param();
  if (p.parameter_choice_case() == inference::InferParameter::kUint64Param &&
      p.uint64_param() <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(p.uint64_param());
  }
  return ParameterType(name, "an int64");
}

absl::StatusOr<std::string> StringParameter(const std::string& name, const inference::InferParameter& p) {
  if (p.parameter_choice_case() != inference::InferParameter::kStringParam) return ParameterType(name, "a string");
  return p.string_param();
}

// "layers" / "heads": one int64, or a string of comma-separated indices. Range checks are the core's.
absl::StatusOr<std::vector<int>> IndexListParameter(const std::string& name, const inference::InferParameter& p) {
  std::vector<int> out;
  auto add = [&](int64_t v) -> absl::Status {
    if (v < INT32_MIN || v > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("parameters.", name, ": ", v, " is out of range"));
    }
    out.push_back(static_cast<int>(v));
    return absl::OkStatus();
  };
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param) {
    if (absl::Status s = add(p.int64_param()); !s.ok()) return s;
    return out;
  }
  if (p.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return ParameterType(name, "an int64 or a string of comma-separated indices");
  }
  // Bounded by the request's size; the core checks each index against the model.
  for (absl::string_view part : absl::StrSplit(p.string_param(), ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters.", name, ": '", part.substr(0, 32), "' is not an index (want e.g. \"0,2\")"));
    }
    if (absl::Status s = add(v); !s.ok()) return s;
  }
  return out;
}

// The texts of the one input: raw contents (4-byte little-endian length, then the bytes, per
// element) or bytes_contents. `n` is the count the shape promises.
absl::StatusOr<std::vector<std::string>> ReadTexts(const inference::ModelInferRequest& in, int64_t n) {
  const inference::ModelInferRequest::InferInputTensor& input = in.inputs(0);
  std::vector<std::string> texts;
  if (in.raw_input_contents_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: ", in.raw_input_contents_size(), " buffers for 1 input"));
  }
  if (in.raw_input_contents_size() == 1) {
    if (input.has_contents() && input.contents().ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          "inputs[0].contents: set beside raw_input_contents; send the texts in one of the two");
    }
    const std::string& raw = in.raw_input_contents(0);
    texts.reserve(static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(raw.size() / 4))));
    size_t at = 0;
    while (at < raw.size()) {
      if (raw.size() - at < 4) {
        return absl::InvalidArgumentError(absl::StrCat("raw_input_contents[0]: element ", texts.size(),
                                                       " has an incomplete 4-byte length at byte ", at));
      }
      uint32_t length = 0;
      for (int b = 3; b >= 0; --b) length = (length << 8) | static_cast<uint8_t>(raw[at + static_cast<size_t>(b)]);
      at += 4;
      if (length > raw.size() - at) {
        return absl::InvalidArgumentError(absl::StrCat("raw_input_contents[0]: element ", texts.size(), " is ", length,
                                                       " bytes, past the end of the buffer"));
      }
      if (static_cast<int64_t>(texts.size()) == n) {
        return absl::InvalidArgumentError(
            absl::StrCat("raw_input_contents[0]: holds more than the ", n, " elements of inputs[0].shape"));
      }
      texts.emplace_back(raw, at, length);
      at += length;
    }
  } else {
    const inference::InferTensorContents& contents = input.contents();
    if (contents.bytes_contents_size() == 0 && contents.ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          "inputs[0].contents: 'text' is BYTES; send the texts as bytes_contents or raw_input_contents");
    }
    texts.assign(contents.bytes_contents().begin(), contents.bytes_contents().end());
  }
  if (static_cast<int64_t>(texts.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[0]: holds ", texts.size(), " elements, but its shape promises ", n));
  }
  return texts;
}

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<std::string> DefaultOutputs(const Manifest& m, const OutputOptions& o, const std::vector<TensorSpec>& specs,
                                        bool tokens) {
  std::vector<std::string> out;
  if (m.task == Task::kClassification) {
    out = {"label", "probabilities"};
  } else {
    out = {"spans", "tags"};
  }
  auto has = [&](const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  };
  const bool per_token = o.attention || o.gates || tokens || m.task == Task::kTagging;
  if (tokens) out.push_back("tokens");
  if (per_token) out.push_back("token_count");
  if (o.attention) {
    for (const char* n : {"attention", "sentence_attention"}) {
      if (has(n)) out.push_back(n);
    }
  }
  if (o.gates) {
    for (const char* n : {"gates", "sentence_gates", "lambda_q", "lambda_k"}) {
      if (has(n)) out.push_back(n);
    }
  }
  if (o.layers.any()) out.push_back("layer_index");
  if (o.layers.gates) {
    for (const char* n : {"layer_gates", "layer_lambda_q", "layer_lambda_k"}) {
      if (has(n)) out.push_back(n);
    }
  }
  if (o.layers.attention_maps && has("layer_attention")) out.push_back("layer_attention");
  return out;
}

// Raw tensor writers: the flattened row-major elements, little-endian (the machines we build for).
void AppendBytes(std::string& raw, const std::string& element) {
  const uint32_t n = static_cast<uint32_t>(element.size());
  for (int b = 0; b < 4; ++b) raw.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  raw.append(element);
}

template <typename T>
void AppendValue(std::string& raw, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  raw.append(bytes, sizeof(T));
}

std::optional<float> TokenValue(const TokenOutput& t, const std::string& name) {
  if (name == "attention") return t.attention;
  if (name == "gates") return t.gate;
  if (name == "sentence_attention") return t.sentence_attention;
  if (name == "sentence_gates") return t.sentence_gate;
  if (name == "lambda_q") return t.lambda_q;
  return t.lambda_k;  // "lambda_k"
}

const std::vector<float>& LayerValues(const LayerMapOutput& m, const std::string& name) {
  if (name == "layer_gates") return m.gates;
  if (name == "layer_lambda_q") return m.lambda_q;
  return m.lambda_k;  // "layer_lambda_k"
}

nlohmann::json SpansJson(const std::vector<SpanOutput>& spans) {
  nlohmann::json out = nlohmann::json::array();
  for (const SpanOutput& s : spans) {
    out.push_back({{"label", s.label},
                   {"start", s.start},
                   {"end", s.end},
                   {"text", s.text},
                   {"score", s.score},
                   {"byte_start", s.byte_start},
                   {"byte_end", s.byte_end},
                   {"token_start", s.token_start},
                   {"token_end", s.token_end}});
  }
  return out;
}

}  // namespace

TensorSpec InputSpec() { return {kInput, "BYTES", {-1}}; }

std::vector<TensorSpec> OutputSpecs(const Manifest& m) {
  std::vector<TensorSpec> specs;
  if (m.task == Task::kClassification) {
    const int64_t c = static_cast<int64_t>(m.labels.size());
    specs = {{"label", "BYTES", {-1}},
             {"probabilities", "FP32", {-1, c}},
             {"labels", "BYTES", {-1, -1}},
             {"scores", "FP32", {-1, -1}}};
  } else {
    specs = {{"spans", "BYTES", {-1}}, {"tags", "BYTES", {-1, -1}}};
  }
  specs.push_back({"tokens", "BYTES", {-1, -1}});
  specs.push_back({"token_count", "INT32", {-1}});
  specs.push_back({"truncated", "BOOL", {-1}});
  for (const char* name : kTokenExplanations) {
    if (m.HasOutput(name)) specs.push_back({name, "FP32", {-1, -1}});
  }
  if (m.HasOutput("layer_attention")) {
    specs.push_back({"layer_index", "INT32", {-1, 2}});
    for (const char* name : kLayerOutputs) {
      if (!m.HasOutput(name)) continue;
      if (std::string(name) == "layer_attention") {
        specs.push_back({name, "FP32", {-1, -1, -1, -1}});
      } else {
        specs.push_back({name, "FP32", {-1, -1, -1}});
      }
    }
  }
  return specs;
}

absl::StatusOr<int64_t> ParseVersion(const std::string& field, const std::string& version) {
  if (version.empty()) return 0;
  int64_t v = 0;
  if (version.size() > 18 ||
      !std::all_of(version.begin(), version.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(version, &v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", version.substr(0, 32),
                                                   "' is not a version (a positive integer, or empty for the newest "
                                                   "ready version)"));
  }
  return v;
}

absl::StatusOr<InferPlan> FromModelInfer(const inference::ModelInferRequest& in, const Manifest& m) {
  InferPlan plan;
  plan.method = m.task == Task::kClassification ? Method::kClassify : Method::kTag;
  InferenceRequest& r = plan.request;
  r.model = in.model_name();
  absl::StatusOr<int64_t> version = ParseVersion("model_version", in.model_version());
  if (!version.ok()) return version.status();
  r.version = *version;
  r.request_id = in.id();

  // The input.
  if (in.inputs_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("inputs: model '", m.name, "' takes one input, '", kInput,
                                                   "' (BYTES [N]); the request has ", in.inputs_size()));
  }
  const inference::ModelInferRequest::InferInputTensor& input = in.inputs(0);
  if (input.name() != kInput) {
    return absl::InvalidArgumentError(absl::StrCat("inputs[0].name: '", input.name().substr(0, 64),
                                                   "' is not an input of model '", m.name, "'; its input is '", kInput,
                                                   "'"));
  }
  if (input.datatype() != "BYTES") {
    return absl::InvalidArgumentError(absl::StrCat("inputs[0].datatype: '", input.datatype().substr(0, 16), "'; '",
                                                   kInput, "' is BYTES (UTF-8 texts)"));
  }
  const auto& shape = input.shape();
  const bool shape_ok = (shape.size() == 1 && shape[0] >= 0) || (shape.size() == 2 && shape[0] >= 0 && shape[1] == 1);
  if (!shape_ok) {
    return absl::InvalidArgumentError(absl::StrCat("inputs[0].shape: ", ShapeText(shape).substr(0, 64), "; '", kInput,
                                                   "' is [N] (or [N, 1]): N texts"));
  }
  for (const auto& [name, unused] : input.parameters()) {
    // KServe's client says how long the raw contents are; the contents say it too.
    if (name == "binary_data_size") continue;
    return absl::InvalidArgumentError(absl::StrCat("inputs[0].parameters.", name.substr(0, 64),
                                                   ": input parameters (shared memory among them) are not supported"));
  }
  absl::StatusOr<std::vector<std::string>> texts = ReadTexts(in, shape[0]);
  if (!texts.ok()) return texts.status();
  r.texts = std::move(*texts);

  // The parameters.
  OutputOptions& o = r.options;
  bool tokens = false;
  for (const auto& [name, value] : in.parameters()) {
    if (KnownParameters().count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameters.", name.substr(0, 64),
                                                     ": not a parameter of ModelInfer (",
                                                     absl::StrJoin(KnownParameters(), ", "), ")"));
    }
    absl::Status s;
    if (name == "top_k") {
      absl::StatusOr<int64_t> k = IntParameter(name, value);
      if (!k.ok()) return k.status();
      if (*k < 0) return absl::InvalidArgumentError(absl::StrCat("parameters.top_k: ", *k, " is negative"));
      plan.top_k = static_cast<int>(std::clamp<int64_t>(*k, 1, std::max<int64_t>(1, m.labels.size())));
    } else if (name == "timeout") {
      absl::StatusOr<int64_t> us = IntParameter(name, value);
      if (!us.ok()) return us.status();
      if (*us <= 0) return absl::InvalidArgumentError(absl::StrCat("parameters.timeout: ", *us, " µs is not positive"));
      plan.timeout = absl::Microseconds(*us);
    } else if (name == "truncation") {
      absl::StatusOr<std::string> t = StringParameter(name, value);
      if (!t.ok()) return t.status();
      if (*t != "truncate" && *t != "error") {
        return absl::InvalidArgumentError(
            absl::StrCat("parameters.truncation: '", t->substr(0, 32), "'; want \"truncate\" or \"error\""));
      }
      o.error_on_truncation = *t == "error";
    } else if (name == "reduction") {
      absl::StatusOr<std::string> t = StringParameter(name, value);
      if (!t.ok()) return t.status();
      if (*t == "none") {
        o.layers.reduction = LayerSelection::Reduction::kNone;
      } else if (*t == "mean_heads") {
        o.layers.reduction = LayerSelection::Reduction::kMeanHeads;
      } else if (*t == "mean_all") {
        o.layers.reduction = LayerSelection::Reduction::kMeanAll;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("parameters.reduction: '", t->substr(0, 32),
                                                       "'; want \"none\", \"mean_heads\" or \"mean_all\""));
      }
    } else if (name == "layers" || name == "heads") {
      absl::StatusOr<std::vector<int>> list = IndexListParameter(name, value);
      if (!list.ok()) return list.status();
      (name == "layers" ? o.layers.layers : o.layers.heads) = std::move(*list);
    } else {
      absl::StatusOr<bool> flag = BoolParameter(name, value);
      if (!flag.ok()) return flag.status();
      if (name == "attention") o.attention = *flag;
      if (name == "gates") o.gates = *flag;
      if (name == "tokens") tokens = *flag;
      if (name == "layer_gates") o.layers.gates = *flag;
      if (name == "layer_attention") o.layers.attention_maps = *flag;
    }
  }

  // The outputs: what is asked decides what is computed.
  const std::vector<TensorSpec> specs = OutputSpecs(m);
  std::set<std::string> seen;
  for (int i = 0; i < in.outputs_size(); ++i) {
    const auto& want = in.outputs(i);
    const std::string field = absl::StrCat("outputs[", i, "]");
    const bool known =
        std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == want.name(); });
    if (!known) {
      std::vector<std::string> names;
      for (const TensorSpec& s : specs) names.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: model '", m.name, "' has no output '",
                                                     want.name().substr(0, 64),
                                                     "'; its outputs: ", absl::StrJoin(names, ", ")));
    }
    if (!seen.insert(want.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: '", want.name(), "' is asked for twice"));
    }
    RequestedOutput out{want.name(), 0};
    for (const auto& [name, value] : want.parameters()) {
      if (name != "classification" || want.name() != "probabilities") {
        return absl::InvalidArgumentError(absl::StrCat(field, ".parameters.", name.substr(0, 64),
                                                       ": not supported (only \"probabilities\" takes a parameter, "
                                                       "\"classification\")"));
      }
      absl::StatusOr<int64_t> k = IntParameter(absl::StrCat("outputs[", i, "].classification"), value);
      if (!k.ok()) return k.status();
      if (*k < 1) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".parameters.classification: ", *k, " is not positive"));
      }
      out.classification = static_cast<int>(std::min<int64_t>(*k, static_cast<int64_t>(m.labels.size())));
    }
    const std::string& n = out.name;
    if (n == "attention" || n == "sentence_attention") o.attention = true;
    if (IsOneOf(n, {"gates", "sentence_gates", "lambda_q", "lambda_k"})) o.gates = true;
    if (IsOneOf(n, {"layer_gates", "layer_lambda_q", "layer_lambda_k"})) o.layers.gates = true;
    if (n == "layer_attention") o.layers.attention_maps = true;
    if (n == "tokens") tokens = true;
    plan.outputs.push_back(std::move(out));
  }
  if (plan.outputs.empty()) {
    for (std::string& n : DefaultOutputs(m, o, specs, tokens)) plan.outputs.push_back({std::move(n), 0});
  }
  o.tokens = tokens;
  // Every label's probability is read (probabilities, labels, scores); the core sorts them, best first.
  if (m.task == Task::kClassification) o.top_k = static_cast<int>(m.labels.size());
  return plan;
}

int64_t AnswerBytes(const InferenceResponse& answer, const InferPlan& plan) {
  const std::vector<TextResult>& results = answer.results;
  const int64_t n = static_cast<int64_t>(results.size());
  int64_t t_max = 0, token_bytes = 0, tag_bytes = 0, label_bytes = 0, span_bytes = 0;
  for (const TextResult& r : results) {
    t_max = std::max<int64_t>(t_max, static_cast<int64_t>(r.tokens.size()));
    for (const TokenOutput& t : r.tokens) {
      token_bytes += static_cast<int64_t>(t.token.text.size());
      tag_bytes += static_cast<int64_t>(t.tag.size());
    }
    for (const auto& label : r.labels)
      label_bytes = std::max<int64_t>(label_bytes, static_cast<int64_t>(label.first.size()));
    // A span's JSON: its text and label (escaped, at most 6 bytes a byte) and the numbers and keys.
    for (const SpanOutput& sp : r.spans) span_bytes += 6 * static_cast<int64_t>(sp.text.size() + sp.label.size()) + 200;
  }
  const int64_t m = results.empty() ? 0 : static_cast<int64_t>(results[0].layers.size());
  const int64_t c = static_cast<int64_t>(answer.manifest->labels.size());
  int64_t total = 0;
  for (const RequestedOutput& want : plan.outputs) {
    const std::string& name = want.name;
    total += 64;  // the tensor's name, datatype and shape
    if (name == "label")
      total += n * (4 + label_bytes);
    else if (name == "probabilities" && want.classification > 0)
      total += n * want.classification * (4 + 32 + label_bytes);
    else if (name == "probabilities")
      total += n * c * 4;
    else if (name == "labels")
      total += n * plan.top_k * (4 + label_bytes);
    else if (name == "scores")
      total += n * plan.top_k * 4;
    else if (name == "spans")
      total += n * 6 + span_bytes;
    else if (name == "tags")
      total += n * t_max * 4 + tag_bytes;
    else if (name == "tokens")
      total += n * t_max * 4 + token_bytes;
    else if (name == "token_count")
      total += n * 4;
    else if (name == "truncated")
      total += n;
    else if (name == "layer_index")
      total += m * 8;
    else if (name == "layer_attention")
      total += n * m * t_max * t_max * 4;
    else if (IsOneOf(name, {"layer_gates", "layer_lambda_q", "layer_lambda_k"}))
      total += n * m * t_max * 4;
    else
      total += n * t_max * 4;
  }
  return total;
}

void ToModelInfer(const InferenceResponse& answer, const InferPlan& plan, const std::string& id,
                  inference::ModelInferResponse* out) {
  const Manifest& m = *answer.manifest;
  const std::vector<TextResult>& results = answer.results;
  const int64_t n = static_cast<int64_t>(results.size());
  int64_t t_max = 0;
  for (const TextResult& r : results) t_max = std::max<int64_t>(t_max, static_cast<int64_t>(r.tokens.size()));
  std::map<std::string, int64_t> label_index;
  for (size_t i = 0; i < m.labels.size(); ++i) label_index.emplace(m.labels[i], static_cast<int64_t>(i));
  const int64_t layer_count = results.empty() ? 0 : static_cast<int64_t>(results[0].layers.size());

  out->set_model_name(answer.model);
  out->set_model_version(absl::StrCat(answer.version));
  out->set_id(id);
  for (const RequestedOutput& want : plan.outputs) {
    auto* tensor = out->add_outputs();
    tensor->set_name(want.name);
    std::string& raw = *out->add_raw_output_contents();
    const std::string& name = want.name;
    auto set = [&](const char* datatype, std::initializer_list<int64_t> shape) {
      tensor->set_datatype(datatype);
      for (int64_t d : shape) tensor->add_shape(d);
    };
    if (name == "label") {
      set("BYTES", {n});
      for (const TextResult& r : results) AppendBytes(raw, r.labels.empty() ? "" : r.labels[0].first);
    } else if (name == "probabilities" && want.classification > 0) {
      const int64_t k = want.classification;
      set("BYTES", {n, k});
      for (const TextResult& r : results) {
        for (int64_t j = 0; j < k; ++j) {
          if (j < static_cast<int64_t>(r.labels.size())) {
            const auto& [label, score] = r.labels[static_cast<size_t>(j)];
            const auto index = label_index.find(label);
            AppendBytes(raw, absl::StrCat(score, ":", index == label_index.end() ? -1 : index->second, ":", label));
          } else {
            AppendBytes(raw, "");
          }
        }
      }
    } else if (name == "probabilities") {
      const int64_t c = static_cast<int64_t>(m.labels.size());
      set("FP32", {n, c});
      for (const TextResult& r : results) {
        std::vector<float> row(static_cast<size_t>(c), 0.0f);
        for (const auto& [label, score] : r.labels) {
          if (auto index = label_index.find(label); index != label_index.end())
            row[static_cast<size_t>(index->second)] = score;
        }
        for (float v : row) AppendValue(raw, v);
      }
    } else if (name == "labels" || name == "scores") {
      const int64_t k = plan.top_k;
      set(name == "labels" ? "BYTES" : "FP32", {n, k});
      for (const TextResult& r : results) {
        for (int64_t j = 0; j < k; ++j) {
          const bool has = j < static_cast<int64_t>(r.labels.size());
          if (name == "labels") {
            AppendBytes(raw, has ? r.labels[static_cast<size_t>(j)].first : "");
          } else {
            AppendValue(raw, has ? r.labels[static_cast<size_t>(j)].second : 0.0f);
          }
        }
      }
    } else if (name == "spans") {
      set("BYTES", {n});
      for (const TextResult& r : results) AppendBytes(raw, SpansJson(r.spans).dump());
    } else if (name == "tags" || name == "tokens") {
      set("BYTES", {n, t_max});
      for (const TextResult& r : results) {
        for (int64_t j = 0; j < t_max; ++j) {
          if (j < static_cast<int64_t>(r.tokens.size())) {
            const TokenOutput& t = r.tokens[static_cast<size_t>(j)];
            AppendBytes(raw, name == "tags" ? t.tag : t.token.text);
          } else {
            AppendBytes(raw, "");
          }
        }
      }
    } else if (name == "token_count") {
      set("INT32", {n});
      const uint32_t max_tokens = static_cast<uint32_t>(std::max(0, m.tokenizer.max_tokens));
      for (const TextResult& r : results) AppendValue(raw, static_cast<int32_t>(std::min(r.num_tokens, max_tokens)));
    } else if (name == "truncated") {
      set("BOOL", {n});
      for (const TextResult& r : results) raw.push_back(r.truncated ? 1 : 0);
    } else if (name == "layer_index") {
      set("INT32", {layer_count, 2});
      if (!results.empty()) {
        for (const LayerMapOutput& l : results[0].layers) {
          AppendValue(raw, static_cast<int32_t>(l.layer));
          AppendValue(raw, static_cast<int32_t>(l.head));
        }
      }
    } else if (name == "layer_attention") {
      set("FP32", {n, layer_count, t_max, t_max});
      for (const TextResult& r : results) {
        const int64_t t = static_cast<int64_t>(r.tokens.size());
        for (int64_t l = 0; l < layer_count; ++l) {
          const std::vector<float>* map =
              l < static_cast<int64_t>(r.layers.size()) ? &r.layers[static_cast<size_t>(l)].attention : nullptr;
          for (int64_t q = 0; q < t_max; ++q) {
            for (int64_t k = 0; k < t_max; ++k) {
              const size_t at = static_cast<size_t>(q * t + k);
              AppendValue(raw, map != nullptr && q < t && k < t && at < map->size() ? (*map)[at] : 0.0f);
            }
          }
        }
      }
    } else if (IsOneOf(name, {"layer_gates", "layer_lambda_q", "layer_lambda_k"})) {
      set("FP32", {n, layer_count, t_max});
      for (const TextResult& r : results) {
        for (int64_t l = 0; l < layer_count; ++l) {
          const std::vector<float>* values = l < static_cast<int64_t>(r.layers.size())
                                                 ? &LayerValues(r.layers[static_cast<size_t>(l)], name)
                                                 : nullptr;
          for (int64_t j = 0; j < t_max; ++j) {
            AppendValue(raw, values != nullptr && j < static_cast<int64_t>(values->size())
                                 ? (*values)[static_cast<size_t>(j)]
                                 : 0.0f);
          }
        }
      }
    } else {  // a per-token explanation
      set("FP32", {n, t_max});
      for (const TextResult& r : results) {
        for (int64_t j = 0; j < t_max; ++j) {
          const std::optional<float> v = j < static_cast<int64_t>(r.tokens.size())
                                             ? TokenValue(r.tokens[static_cast<size_t>(j)], name)
                                             : std::nullopt;
          AppendValue(raw, v.value_or(0.0f));
        }
      }
    }
  }
}

}  // namespace qvi::oip
