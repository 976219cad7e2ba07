// A Classify/Tag request in the core's terms. Apart from the other conversions (api.h), which
// need the model repository and so torch, so that the request fuzz target (fuzz/) builds it alone.
#ifndef QVI_SERVER_FRONTEND_NATIVE_REQUEST_H_
#define QVI_SERVER_FRONTEND_NATIVE_REQUEST_H_

#include <string>

#include "qvi/serving/v1/inference.pb.h"
#include "server/core/request/request.h"

namespace qvi {

namespace v1 = ::qvi::serving::v1;

InferenceRequest FromProto(const v1::ModelSpec& model, const google::protobuf::RepeatedPtrField<std::string>& texts,
                           const v1::OutputOptions& options, const std::string& request_id, int priority = 0);

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_NATIVE_REQUEST_H_
