// The native API (qvi.serving.v1) in the core's terms, whatever carries it (gRPC, or HTTP/JSON in
// protobuf's JSON mapping): the answers converted from the core's types, and the answers of the
// calls that only read the server's state (ListModels, GetModel).
#ifndef QVI_SERVER_FRONTEND_NATIVE_API_H_
#define QVI_SERVER_FRONTEND_NATIVE_API_H_

#include "absl/status/status.h"
#include "qvi/serving/v1/inference.pb.h"
#include "server/core/repository/model_repository.h"
#include "server/core/request/request.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/shadow.h"
#include "server/frontend/native/request.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

void ToProto(const InferenceResponse& in, v1::ClassifyResponse* out);
void ToProto(const InferenceResponse& in, v1::TagResponse* out);
void ToProto(const ModelStatus& in, v1::ModelInfo* out);
// The catalogue outputs the native API carries as Token or LayerMap fields (for the test that every
// catalogue row with an answer field has one).
std::vector<Output> OutputsWithProtoFields();

// ListModels' and GetModel's answers (GetModel: NOT_FOUND for an unknown model or version).
void ListModelsAnswer(const ModelRepository& repository, v1::ListModelsResponse* response);
// With `shadow`, the model's shadow comparisons (Core::ShadowSummaries) in the answer's `shadow`.
absl::Status GetModelAnswer(const ModelRepository& repository, const RequestLimits& limits,
                            const v1::GetModelRequest& request, v1::GetModelResponse* response,
                            const std::vector<ShadowSummary>& shadow = {});
// A shadow comparison as the wire carries it (GetModel's `shadow`, GET /v1/models/{m}/shadow).
void ToProto(const ShadowSummary& summary, v1::ShadowComparison* out);

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_NATIVE_API_H_
