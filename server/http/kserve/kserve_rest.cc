#include "server/http/kserve/kserve_rest.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "server/http/native/json_body.h"

namespace qvi::rest {

namespace {

using json = nlohmann::json;
using Params = google::protobuf::Map<std::string, inference::InferParameter>;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// {name: bool | integer | string}, as InferParameters.
absl::Status ReadParameters(const json& j, const std::string& field, Params* out) {
  if (!j.is_object()) return Bad(field, "must be an object");
  for (const auto& [name, value] : j.items()) {
    inference::InferParameter p;
    if (value.is_boolean()) {
      p.set_bool_param(value.get<bool>());
    } else if (value.is_number_integer()) {
      if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Bad(field + "." + Clip(name, 64), "out of the range of int64");
      }
      p.set_int64_param(value.get<int64_t>());
    } else if (value.is_string()) {
      p.set_string_param(value.get<std::string>());
    } else {
      return Bad(field + "." + Clip(name, 64), "must be a boolean, an integer or a string");
    }
    (*out)[name] = p;
  }
  return absl::OkStatus();
}

// The elements of "data", nested as the shape or flat, into the tensor's BYTES contents.
absl::Status ReadStrings(const json& data, const std::string& field, inference::InferTensorContents* out) {
  if (data.is_string()) {
    out->add_bytes_contents(data.get<std::string>());
    return absl::OkStatus();
  }
  if (!data.is_array()) return Bad(field, "must be a string or an array of them (the BYTES tensor's elements)");
  for (size_t i = 0; i < data.size(); ++i) {
    if (absl::Status s = ReadStrings(data[i], absl::StrCat(field, "[", i, "]"), out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// An input without "data": its raw contents, parameters.binary_data_size bytes from the front of `binary`.
absl::Status ReadBinaryInput(const inference::ModelInferRequest::InferInputTensor& input, const std::string& field,
                             std::string_view& binary, std::string* raw) {
  const auto size = input.parameters().find("binary_data_size");
  if (size == input.parameters().end()) {
    return Bad(field + ".data", "is missing (or, with the binary-data extension, parameters.binary_data_size)");
  }
  if (size->second.parameter_choice_case() != inference::InferParameter::kInt64Param ||
      size->second.int64_param() < 0) {
    return Bad(field + ".parameters.binary_data_size", "must be a non-negative integer");
  }
  const uint64_t n = static_cast<uint64_t>(size->second.int64_param());
  if (n > binary.size()) {
    return Bad(field + ".parameters.binary_data_size",
               absl::StrCat(n, " bytes, but ", binary.size(), " bytes of binary data are left in the body"));
  }
  raw->assign(binary.substr(0, n));
  binary.remove_prefix(n);
  return absl::OkStatus();
}

absl::Status ReadInput(const json& in, const std::string& field, inference::ModelInferRequest::InferInputTensor* out,
                       std::string_view& binary, inference::ModelInferRequest* request) {
  if (!in.is_object()) return Bad(field, "must be an object");
  for (const char* key : {"name", "datatype"}) {
    if (!in.contains(key) || !in[key].is_string()) return Bad(absl::StrCat(field, ".", key), "must be a string");
  }
  out->set_name(in["name"].get<std::string>());
  out->set_datatype(in["datatype"].get<std::string>());
  if (!in.contains("shape") || !in["shape"].is_array()) return Bad(field + ".shape", "must be an array of integers");
  for (size_t i = 0; i < in["shape"].size(); ++i) {
    const json& d = in["shape"][i];
    if (!d.is_number_integer()) return Bad(absl::StrCat(field, ".shape[", i, "]"), "must be an integer");
    out->add_shape(d.get<int64_t>());
  }
  if (in.contains("parameters")) {
    if (absl::Status s = ReadParameters(in["parameters"], field + ".parameters", out->mutable_parameters()); !s.ok()) {
      return s;
    }
  }
  if (!in.contains("data")) return ReadBinaryInput(*out, field, binary, request->add_raw_input_contents());
  if (out->datatype() != "BYTES") {
    return Bad(field + ".datatype", absl::StrCat("'", Clip(out->datatype(), 40), "'; the input \"text\" is BYTES"));
  }
  return ReadStrings(in["data"], field + ".data", out->mutable_contents());
}

template <typename T>
json Numbers(const std::string& raw) {
  json data = json::array();
  const size_t n = raw.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    data.push_back(v);
  }
  return data;
}

// BYTES raw contents: each element a 4-byte little-endian length and its bytes.
absl::StatusOr<json> Strings(const std::string& raw, const std::string& name) {
  json data = json::array();
  size_t at = 0;
  while (at < raw.size()) {
    if (raw.size() - at < 4) return absl::InternalError(absl::StrCat("output ", name, ": truncated BYTES element"));
    uint32_t n = 0;
    for (int b = 3; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(raw[at + b]);
    at += 4;
    if (raw.size() - at < n) return absl::InternalError(absl::StrCat("output ", name, ": truncated BYTES element"));
    data.push_back(raw.substr(at, n));
    at += n;
  }
  return data;
}

// A boolean parameter of the binary-data extension, taken out of `params` (the OIP service knows none).
absl::StatusOr<std::optional<bool>> TakeFlag(Params* params, const std::string& name, const std::string& field) {
  const auto it = params->find(name);
  if (it == params->end()) return std::optional<bool>();
  if (it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
    return Bad(field + "." + name, "must be a boolean");
  }
  const bool value = it->second.bool_param();
  params->erase(it);
  return std::optional<bool>(value);
}

// "outputs": [{"name", "parameters"}], the outputs asked for.
absl::Status ReadOutputs(const json& value, ParsedInfer* call) {
  inference::ModelInferRequest* out = &call->request;
  if (!value.is_array()) return Bad("outputs", "must be an array");
  for (size_t i = 0; i < value.size(); ++i) {
    const json& o = value[i];
    const std::string field = absl::StrCat("outputs[", i, "]");
    if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
      return Bad(field + ".name", "must be a string");
    auto* requested = out->add_outputs();
    requested->set_name(o["name"].get<std::string>());
    if (o.contains("parameters")) {
      if (absl::Status s = ReadParameters(o["parameters"], field + ".parameters", requested->mutable_parameters());
          !s.ok()) {
        return s;
      }
      absl::StatusOr<std::optional<bool>> binary =
          TakeFlag(requested->mutable_parameters(), "binary_data", field + ".parameters");
      if (!binary.ok()) return binary.status();
      if (binary->has_value()) call->binary_by_output[requested->name()] = **binary;
    }
  }
  return absl::OkStatus();
}

// "model_name" or "model_version", which clients (KServe's) repeat from the path: they must agree.
absl::Status CheckModelField(const std::string& key, const json& value, const std::string& path_value) {
  if (!value.is_string()) return Bad(key, "must be a string");
  const std::string& given = value.get_ref<const std::string&>();
  if (!given.empty() && !path_value.empty() && given != path_value) {
    return Bad(key, absl::StrCat("'", Clip(given, 64), "' is not the path's '", path_value, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The request's "parameters", binary_data_output taken out.
absl::Status ReadRequestParameters(const json& value, ParsedInfer* call) {
  Params* params = call->request.mutable_parameters();
  if (absl::Status s = ReadParameters(value, "parameters", params); !s.ok()) return s;
  absl::StatusOr<std::optional<bool>> all = TakeFlag(params, "binary_data_output", "parameters");
  if (!all.ok()) return all.status();
  call->binary_by_default = all->value_or(false);
  return absl::OkStatus();
}

// "inputs", their binary contents taken from the front of `binary` in order.
absl::Status ReadInputs(const json& value, std::string_view& binary, inference::ModelInferRequest* out) {
  if (!value.is_array()) return Bad("inputs", "must be an array");
  for (size_t i = 0; i < value.size(); ++i) {
    if (absl::Status s = ReadInput(value[i], absl::StrCat("inputs[", i, "]"), out->add_inputs(), binary, out);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ParsedInfer::Binary(const std::string& output) const {
  const auto it = binary_by_output.find(output);
  return it == binary_by_output.end() ? binary_by_default : it->second;
}

absl::StatusOr<ParsedInfer> InferRequest(const json& body, const std::string& model, const std::string& version,
                                         std::string_view binary) {
  if (!body.is_object()) return Bad("request body", "must be a JSON object");
  ParsedInfer call;
  inference::ModelInferRequest& out = call.request;
  out.set_model_name(model);
  out.set_model_version(version);
  for (const auto& [key, value] : body.items()) {
    if (key == "id") {
      if (!value.is_string()) return Bad("id", "must be a string");
      out.set_id(value.get<std::string>());
    } else if (key == "model_name" || key == "model_version") {
      if (absl::Status s = CheckModelField(key, value, key == "model_name" ? model : version); !s.ok()) return s;
    } else if (key == "parameters") {
      if (absl::Status s = ReadRequestParameters(value, &call); !s.ok()) return s;
    } else if (key == "inputs") {
      if (absl::Status s = ReadInputs(value, binary, &out); !s.ok()) return s;
    } else if (key == "outputs") {
      if (absl::Status s = ReadOutputs(value, &call); !s.ok()) return s;
    } else {
      return Bad(Clip(key, 64),
                 "is not a field of an inference request (id, parameters, inputs, outputs, model_name, model_version)");
    }
  }
  if (!binary.empty()) {
    return Bad("request body", absl::StrCat(binary.size(),
                                            " bytes follow the JSON header that no input's "
                                            "parameters.binary_data_size accounts for"));
  }
  if (out.raw_input_contents_size() > 0 && out.raw_input_contents_size() != out.inputs_size()) {
    return Bad("inputs", "give every input's contents in \"data\" or every input's in binary, not some of each");
  }
  return call;
}

// A raw output's elements as JSON.
absl::StatusOr<json> DecodeRaw(const std::string& datatype, const std::string& name, const std::string& raw) {
  if (datatype == "FP32") return Numbers<float>(raw);
  if (datatype == "INT32") return Numbers<int32_t>(raw);
  if (datatype == "INT64") return Numbers<int64_t>(raw);
  if (datatype == "BOOL") {
    json data = json::array();
    for (char c : raw) data.push_back(c != 0);
    return data;
  }
  if (datatype == "BYTES") return Strings(raw, name);
  return absl::InternalError(absl::StrCat("output ", name, ": datatype ", datatype, " has no JSON form here"));
}

absl::StatusOr<InferAnswer> InferResponse(const inference::ModelInferResponse& response, const ParsedInfer& call) {
  InferAnswer answer;
  json& out = answer.header;
  out = {{"model_name", response.model_name()},
         {"model_version", response.model_version()},
         {"id", response.id()},
         {"outputs", json::array()}};
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& tensor = response.outputs(i);
    const std::string& raw = i < response.raw_output_contents_size() ? response.raw_output_contents(i) : "";
    json o = {{"name", tensor.name()},
              {"datatype", tensor.datatype()},
              {"shape", json(std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()))}};
    if (call.Binary(tensor.name())) {
      // The protocol's raw contents are the extension's binary form already (little-endian; BYTES
      // length-prefixed).
      o["parameters"] = {{"binary_data_size", raw.size()}};
      answer.binary += raw;
    } else {
      absl::StatusOr<json> data = DecodeRaw(tensor.datatype(), tensor.name(), raw);
      if (!data.ok()) return data.status();
      o["data"] = *std::move(data);
    }
    out["outputs"].push_back(std::move(o));
  }
  return answer;
}

json ModelMetadata(const inference::ModelMetadataResponse& response) {
  const auto tensors = [](const auto& list) {
    json out = json::array();
    for (const auto& t : list) {
      out.push_back({{"name", t.name()},
                     {"datatype", t.datatype()},
                     {"shape", json(std::vector<int64_t>(t.shape().begin(), t.shape().end()))}});
    }
    return out;
  };
  json parameters = json::object();
  for (const auto& [key, value] : response.properties()) parameters[key] = value;
  return {{"name", response.name()},
          {"versions", json(std::vector<std::string>(response.versions().begin(), response.versions().end()))},
          {"platform", response.platform()},
          {"inputs", tensors(response.inputs())},
          {"outputs", tensors(response.outputs())},
          {"parameters", std::move(parameters)}};
}

}  // namespace qvi::rest
