// Which model a drop-in route or RPC answers from (TEI's, vLLM's: docs/serving.md, "Drop-in routes"), on every
// transport: HTTP (server/http/drop_in.h) and TEI's gRPC service (server/grpc/tei/).
#ifndef QVI_SERVER_FRONTEND_DROP_IN_MODEL_H_
#define QVI_SERVER_FRONTEND_DROP_IN_MODEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/core/repository/model_repository.h"

namespace qvi {

// A drop-in route names a model in its path or body, or not at all: the named one; else --default-model; else
// the store's only model. Several and none named: INVALID_ARGUMENT saying how to name one (`how_to_name`); none
// in the store yet: UNAVAILABLE.
absl::StatusOr<std::string> ChooseModel(const std::string& named, const std::string& default_model,
                                        const ModelRepository& repository, const char* how_to_name);

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_DROP_IN_MODEL_H_
