// The TorchScript backend: model.pt, a torch.jit archive with manifest.json and vocab.txt as extra
// files (model_store/README.md). Runs `forward`, and `forward_without_maps` when the module has it.
#ifndef QVI_SERVER_CORE_MODEL_TORCHSCRIPT_MODEL_H_
#define QVI_SERVER_CORE_MODEL_TORCHSCRIPT_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/model/model.h"

namespace qvi {

// Reads `path`, checks its manifest and vocabulary, moves it to `device` and warms it up.
absl::StatusOr<std::unique_ptr<Model>> LoadTorchScript(const std::string& path, const c10::Device& device);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_TORCHSCRIPT_MODEL_H_
