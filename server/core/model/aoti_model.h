// The AOTInductor backend: model.cpu.pt2 / model.cuda.pt2, PT2 archives written by
// `python -m qvi export --format pt2` (model_store/qvi/pt2.py has the layout). Each holds the model
// compiled ahead of time ("model", and "without_maps" for the Transformer models), manifest.json,
// vocab.txt and pt2.json: the device, CPU features and torch version it was compiled for, the
// batch and length range of its dynamic shapes, and for taggers the CRF scores (the server decodes
// their tags, server/core/model/viterbi.h).
//
// A package is checked before any of its code is loaded: compiled for another device kind, for CPU
// features this machine lacks or by another torch version, it is refused with that reason.
#ifndef QVI_SERVER_CORE_MODEL_AOTI_MODEL_H_
#define QVI_SERVER_CORE_MODEL_AOTI_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/model/model.h"

namespace qvi {

// `instances`: how many threads will call Forward() at once (one compiled runner each).
absl::StatusOr<std::unique_ptr<Model>> LoadAotInductor(const std::string& path, const c10::Device& device,
                                                       int instances);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_AOTI_MODEL_H_
