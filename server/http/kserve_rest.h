// KServe's v2 REST protocol (the Open Inference Protocol over HTTP/JSON) to and from the OIP gRPC
// messages, so that the REST routes share the gRPC service's planning and answers
// (oip_service.h, oip_convert.h). Pure functions; http_api.cc does the calling.
//
// A request: {"id", "parameters": {name: bool | integer | string}, "inputs": [{"name", "shape",
// "datatype", "data", "parameters"}], "outputs": [{"name", "parameters"}]}; the input "text" is BYTES
// with its texts as JSON strings in "data" (nested as its shape, or flat). An answer: {"model_name",
// "model_version", "id", "outputs": [{"name", "datatype", "shape", "data"}]} with "data" flat, in row-
// major order, as the protocol writes it. The binary-data extension is not supported.
#ifndef QVI_SERVER_HTTP_KSERVE_REST_H_
#define QVI_SERVER_HTTP_KSERVE_REST_H_

#include <string>

#include "absl/status/statusor.h"
#include "inference/open_inference_grpc.pb.h"
#include "nlohmann/json.hpp"

namespace qvi::rest {

// The request's JSON (already walked by the body scan: well-formed and bounded) as a ModelInfer
// request for `model` and `version` ("" for the newest). INVALID_ARGUMENT names the field.
absl::StatusOr<inference::ModelInferRequest> InferRequest(const nlohmann::json& body, const std::string& model,
                                                          const std::string& version);

// The answer's tensors with their raw contents decoded into "data" (FP32, INT32, INT64, BOOL, BYTES).
absl::StatusOr<nlohmann::json> InferResponse(const inference::ModelInferResponse& response);

// ModelMetadata as the REST protocol writes it: shapes as numbers; the properties under "parameters".
nlohmann::json ModelMetadata(const inference::ModelMetadataResponse& response);

}  // namespace qvi::rest

#endif  // QVI_SERVER_HTTP_KSERVE_REST_H_
