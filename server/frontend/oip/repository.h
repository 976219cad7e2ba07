// OIP's model-repository extension in the core's terms, whatever carries it (gRPC by method name,
// server/grpc/oip/repository_service.h; KServe v2 REST's /v2/repository/..., server/http/kserve/):
//
//   RepositoryIndex        every model of the store and each version's state (READY, LOADING,
//                          UNLOADING, UNAVAILABLE with the reason); a model not loaded has one
//                          entry with no version, UNAVAILABLE "not loaded" (or why it rests: unloaded
//                          for the memory budget or idleness). `ready`: READY ones only.
//   RepositoryModelLoad    ModelRepository::RequestLoad; answered once the model serves, or why not.
//   RepositoryModelUnload  ModelRepository::RequestUnload; answered once no version is handed out.
//
// All three need the `admin` scope (the caller checks it); load and unload need --model-control
// explicit (FAILED_PRECONDITION otherwise, as Triton answers in its poll mode).
#ifndef QVI_SERVER_FRONTEND_OIP_REPOSITORY_H_
#define QVI_SERVER_FRONTEND_OIP_REPOSITORY_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "inference/repository.pb.h"
#include "server/core/repository/model_repository.h"

namespace qvi {

class OipRepository {
 public:
  using Done = std::function<void(const absl::Status&)>;

  explicit OipRepository(ModelRepository* repository) : repository_(repository) {}

  absl::Status Index(const inference::RepositoryIndexRequest& request,
                     inference::RepositoryIndexResponse* response) const;
  // `done` runs once: at once for a refused request, else when the repository has finished.
  void Load(const inference::RepositoryModelLoadRequest& request, Done done) const;
  void Unload(const inference::RepositoryModelUnloadRequest& request, Done done) const;
  // ModelRepository::SetShadow: an admin's shadow candidate for `model`, or none.
  absl::Status SetShadow(const std::string& model, std::optional<ShadowSettings> shadow) const {
    return repository_->SetShadow(model, shadow);
  }

 private:
  ModelRepository* repository_;
};

// The model a load or unload names: model_name, or (KServe's layout, field 1 alone) repository_name.
std::string ControlledModel(const std::string& repository_name, const std::string& model_name);

// INVALID_ARGUMENT for a repository_name (the server has one store) or a parameter the call does not
// take; the messages name the field.
absl::Status CheckRepositoryName(const std::string& name);

}  // namespace qvi

#endif  // QVI_SERVER_FRONTEND_OIP_REPOSITORY_H_
