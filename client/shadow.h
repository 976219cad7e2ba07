// `qvi-client shadow --model M`: how the model's shadow candidate answers against its serving version
// (GetModel's `shadow`; docs/serving.md, "Shadow versions"): per pair of versions, the texts mirrored,
// compared and dropped, the label agreement and flips, span F1, rank correlation, score and latency
// differences, and the texts that disagree most (as the server keeps them: the text with keep_texts, else
// the start of its SHA-256).
#ifndef QVI_CLIENT_SHADOW_H_
#define QVI_CLIENT_SHADOW_H_

#include <ostream>

#include "qvi/serving/v1/inference.pb.h"

namespace qvi::client {

// Writes `model`'s comparisons; "no shadow candidate" when it has none. Returns 0, or 3 when it has none.
int PrintShadow(const serving::v1::GetModelResponse& model, std::ostream& out);

}  // namespace qvi::client

#endif  // QVI_CLIENT_SHADOW_H_
