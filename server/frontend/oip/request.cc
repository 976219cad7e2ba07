#include "server/frontend/oip/tensors.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/request/request_checks.h"

namespace qvi::oip {
namespace {

constexpr char kInput[] = "text";

// The request-level parameters ModelInfer reads: its own, and the output switches of the catalogue
// (outputs.h, NamesOf), so that a row with a new switch is a parameter here too.
const std::set<std::string>& KnownParameters() {
  static const std::set<std::string> known = [] {
    std::set<std::string> names = {"top_k",    "truncation",         "layers",   "heads",    "reduction",
                                   "timeout",  "faithfulness_top_k", "priority", "subwords", "raw_scores",
                                   "coverage", "abstain_below"};
    for (const OutputRow& row : OutputCatalogue()) {
      if (const char* parameter = NamesOf(row.on).parameter) names.insert(parameter);
    }
    return names;
  }();
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

// A double, or a whole number (tritonclient sends 1 as an int64).
absl::StatusOr<double> DoubleParameter(const std::string& name, const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kDoubleParam:
      return p.double_param();
    case inference::InferParameter::kInt64Param:
      return static_cast<double>(p.int64_param());
    case inference::InferParameter::kUint64Param:
      return static_cast<double>(p.uint64_param());
    default:
      return ParameterType(name, "a double");
  }
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

// The one input, "text", into the request's texts.
absl::Status ReadInput(const inference::ModelInferRequest& in, const Manifest& m, InferenceRequest& r) {
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
  return absl::OkStatus();
}

// "faithfulness_top_k": the per-answer check of α (the native API's options.faithfulness.top_k),
// refused here, before the model runs, where it cannot be answered.
absl::Status ReadFaithfulness(const inference::InferParameter& value, const Manifest& m, OutputOptions& o) {
  absl::StatusOr<int64_t> k = IntParameter("faithfulness_top_k", value);
  if (!k.ok()) return k.status();
  if (*k < 0 || *k > kMaxFaithfulnessTopK) {
    return absl::InvalidArgumentError(absl::StrCat("parameters.faithfulness_top_k: ", *k, " is outside [0, ",
                                                   kMaxFaithfulnessTopK, "]; 0 = no check"));
  }
  if (*k > 0 && m.task != Task::kClassification) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters.faithfulness_top_k: the check is for classifiers; model '", m.name, "' tags"));
  }
  if (*k > 0 && !HasOutput(m, Output::kAttention)) {
    return absl::InvalidArgumentError(absl::StrCat("parameters.faithfulness_top_k: model '", m.name, "' (",
                                                   m.display_name, ") has no attention to check"));
  }
  o.faithfulness_top_k = static_cast<int>(*k);
  return absl::OkStatus();
}

// The request-level parameters.
absl::Status ReadParameters(const inference::ModelInferRequest& in, const Manifest& m, InferPlan& plan) {
  OutputOptions& o = plan.request.options;
  for (const auto& [name, value] : in.parameters()) {
    if (KnownParameters().count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameters.", name.substr(0, 64),
                                                     ": not a parameter of ModelInfer (",
                                                     absl::StrJoin(KnownParameters(), ", "), ")"));
    }
    if (name == "top_k") {
      absl::StatusOr<int64_t> k = IntParameter(name, value);
      if (!k.ok()) return k.status();
      if (*k < 0) return absl::InvalidArgumentError(absl::StrCat("parameters.top_k: ", *k, " is negative"));
      plan.top_k = static_cast<int>(std::clamp<int64_t>(*k, 1, std::max<int64_t>(1, m.labels.size())));
    } else if (name == "faithfulness_top_k") {
      if (absl::Status st = ReadFaithfulness(value, m, o); !st.ok()) return st;
    } else if (name == "coverage" || name == "abstain_below") {  // checked by the core (trust.h)
      absl::StatusOr<double> v = DoubleParameter(name, value);
      if (!v.ok()) return v.status();
      (name == "coverage" ? o.coverage : o.abstain_below) = *v;
    } else if (name == "priority") {  // tritonclient's infer(priority=N): 1 the highest, 0 the default
      absl::StatusOr<int64_t> n = IntParameter(name, value);
      if (!n.ok()) return n.status();
      absl::StatusOr<Priority> p = PriorityFromNumber(*n, "parameters.priority");
      if (!p.ok()) return p.status();
      plan.request.priority = *p;
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
    } else if (name == "subwords" || name == "raw_scores") {  // OutputOptions::subwords, raw_scores
      absl::StatusOr<bool> flag = BoolParameter(name, value);
      if (!flag.ok()) return flag.status();
      (name == "subwords" ? o.subwords : o.raw_scores) = *flag;
    } else if (name == "layers" || name == "heads") {
      absl::StatusOr<std::vector<int>> list = IndexListParameter(name, value);
      if (!list.ok()) return list.status();
      (name == "layers" ? o.layers.layers : o.layers.heads) = std::move(*list);
    } else {  // a switch of outputs (SwitchParameter): true adds them, and computes them
      absl::StatusOr<bool> flag = BoolParameter(name, value);
      if (!flag.ok()) return flag.status();
      if (*flag) o.Ask(*SwitchParameter(name));
    }
  }
  return absl::OkStatus();
}

// An output a request names: one the model has, named once, with the parameter it needs when it needs one.
absl::Status CheckNamed(const std::string& field, const std::string& name, std::optional<Output> output,
                        const Manifest& m, const OutputOptions& o, const OutputSet& seen) {
  if (!output || !HasWireOutput(m, *output)) {
    std::vector<std::string> names;
    for (const TensorSpec& s : WireOutputs(m)) names.push_back(s.name);
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: model '", m.name, "' has no output '",
                                                   name.substr(0, 64), "'; its outputs: ", absl::StrJoin(names, ", ")));
  }
  if (seen.test(static_cast<size_t>(*output))) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: '", name, "' is asked for twice"));
  }
  const OutputSwitch on = Row(*output).on;
  if (on == OutputSwitch::kFaithfulness && o.faithfulness_top_k == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: '", name,
                                                   "' is the faithfulness check's; ask for the check with "
                                                   "parameters.faithfulness_top_k (1-",
                                                   kMaxFaithfulnessTopK, ")"));
  }
  if ((on == OutputSwitch::kCoverage && !o.coverage) || (on == OutputSwitch::kAbstention && !o.abstain_below)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: '", name, "' needs parameters.",
                                                   on == OutputSwitch::kCoverage ? "coverage" : "abstain_below"));
  }
  return absl::OkStatus();
}

// The outputs asked for (or the defaults), in the answer's order; what is asked decides what is computed.
absl::Status ReadOutputs(const inference::ModelInferRequest& in, const Manifest& m, InferPlan& plan) {
  OutputOptions& o = plan.request.options;
  OutputSet seen;
  for (int i = 0; i < in.outputs_size(); ++i) {
    const auto& want = in.outputs(i);
    const std::string field = absl::StrCat("outputs[", i, "]");
    const std::optional<Output> output = OutputNamed(want.name());
    if (absl::Status named = CheckNamed(field, want.name(), output, m, o, seen); !named.ok()) return named;
    seen.set(static_cast<size_t>(*output));
    RequestedOutput out{*output, 0};
    for (const auto& [name, value] : want.parameters()) {
      if (name != "classification" || *output != Output::kProbabilities) {
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
    plan.outputs.push_back(out);
  }
  // What is named is computed, beside what the parameters turned on.
  for (Output named : InOrder(seen)) {
    if (NamesOf(Row(named).on).option != nullptr) o.outputs.set(static_cast<size_t>(named));
  }
  if (plan.outputs.empty()) {
    // The check's tensors come with it; they are not outputs the model computes, so only this list
    // holds them (the check itself is o.faithfulness_top_k).
    OutputSet asked = o.outputs;
    if (o.faithfulness_top_k > 0) asked |= SwitchedBy(OutputSwitch::kFaithfulness);
    if (o.coverage) asked |= SwitchedBy(OutputSwitch::kCoverage);
    if (o.abstain_below) asked |= SwitchedBy(OutputSwitch::kAbstention);
    for (Output output : DefaultWireOutputs(m, asked)) plan.outputs.push_back({output, 0});
  }
  // Every label's probability is read (probabilities, labels, scores); the core sorts them, best first.
  if (m.task == Task::kClassification) o.top_k = static_cast<int>(m.labels.size());
  return absl::OkStatus();
}

}  // namespace

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

absl::StatusOr<InferPlan> FromModelInfer(const inference::ModelInferRequest& in, const Manifest& m,
                                         const ServingConfig& serving) {
  InferPlan plan;
  plan.method = m.task == Task::kClassification ? Method::kClassify : Method::kTag;
  InferenceRequest& r = plan.request;
  r.model = in.model_name();
  absl::StatusOr<int64_t> version = ParseVersion("model_version", in.model_version());
  if (!version.ok()) return version.status();
  r.version = *version;
  r.request_id = in.id();
  if (absl::Status s = ReadInput(in, m, r); !s.ok()) return s;
  if (absl::Status s = ReadParameters(in, m, plan); !s.ok()) return s;
  ApplyServingDefaults(serving, r.options);  // a model's default abstain_below brings the "abstained" tensor too
  if (absl::Status s = ReadOutputs(in, m, plan); !s.ok()) return s;
  return plan;
}

}  // namespace qvi::oip
