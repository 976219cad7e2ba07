// KServe's v2 REST protocol (the Open Inference Protocol over HTTP/JSON) to and from the OIP gRPC
// messages, so that the REST routes share the gRPC service's planning and answers
// (server/frontend/oip/api.h, tensors.h). Pure functions; kserve_routes.cc does the calling.
//
// A request: {"id", "parameters": {name: bool | integer | string}, "inputs": [{"name", "shape",
// "datatype", "data", "parameters"}], "outputs": [{"name", "parameters"}]}; the input "text" is BYTES
// with its texts as JSON strings in "data" (nested as its shape, or flat). An answer: {"model_name",
// "model_version", "id", "outputs": [{"name", "datatype", "shape", "data"}]} with "data" flat, in row-
// major order, as the protocol writes it.
//
// The binary-data extension (Triton's, what tritonclient.http sends by default): the body is the JSON
// header (its length in the Inference-Header-Content-Length header) followed by the inputs' raw
// contents, each input without "data" saying its length in parameters.binary_data_size (BYTES: each
// element a 4-byte little-endian length and its bytes). Outputs asked for in binary (their
// parameters.binary_data, else the request's parameters.binary_data_output) leave "data" out of the
// answer's JSON, say their length in parameters.binary_data_size, and follow the JSON in order.
#ifndef QVI_SERVER_HTTP_KSERVE_KSERVE_REST_H_
#define QVI_SERVER_HTTP_KSERVE_KSERVE_REST_H_

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "inference/open_inference_grpc.pb.h"
#include "nlohmann/json.hpp"

namespace qvi::rest {

// A REST inference request as a ModelInfer request, and which outputs its answer gives in binary.
struct ParsedInfer {
  inference::ModelInferRequest request;
  bool binary_by_default = false;                // parameters.binary_data_output
  std::map<std::string, bool> binary_by_output;  // outputs[i].parameters.binary_data
  bool Binary(const std::string& output) const;
};

// The request's JSON (already walked by the body scan: well-formed and bounded), with `binary` the bytes
// after it (the binary-data extension; empty without), for `model` and `version` ("" for the newest).
// INVALID_ARGUMENT names the field.
absl::StatusOr<ParsedInfer> InferRequest(const nlohmann::json& body, const std::string& model,
                                         const std::string& version, std::string_view binary = {});

// An answer: its JSON, and the binary contents that follow it (empty when no output is in binary).
struct InferAnswer {
  nlohmann::json header;
  std::string binary;
};

// The answer's tensors with their raw contents decoded into "data" (FP32, INT32, INT64, BOOL, BYTES), or
// for the outputs `call` asked in binary, appended to `binary` as they are.
absl::StatusOr<InferAnswer> InferResponse(const inference::ModelInferResponse& response, const ParsedInfer& call);

// ModelMetadata as the REST protocol writes it: shapes as numbers; the properties under "parameters".
nlohmann::json ModelMetadata(const inference::ModelMetadataResponse& response);

}  // namespace qvi::rest

#endif  // QVI_SERVER_HTTP_KSERVE_KSERVE_REST_H_
