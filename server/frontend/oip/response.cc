#include "absl/strings/str_cat.h"
#include "server/frontend/oip/tensors.h"

#include "server/core/request/request_checks.h"

namespace qvi::oip {

namespace {
int64_t TensorsBytes(const AnswerView& view, const InferPlan& plan) {
  int64_t total = 0;
  for (const RequestedOutput& want : plan.outputs) total += AnswerTensorBytes(view, want.output, want.classification);
  return total;
}
}  // namespace

int64_t AnswerBytes(const InferenceResponse& answer, const InferPlan& plan) {
  return TensorsBytes(AnswerView(answer, plan.top_k), plan);
}

int64_t AnswerBytesBefore(const InferenceRequest& request, const InferenceResponse& tokenised, const InferPlan& plan) {
  const int64_t maps = LayerMapsPerText(*tokenised.manifest, request.options);
  return TensorsBytes(AnswerView::Before(tokenised, plan.top_k, maps), plan);
}

void ToModelInfer(const InferenceResponse& answer, const InferPlan& plan, const std::string& id,
                  inference::ModelInferResponse* out) {
  const AnswerView view(answer, plan.top_k);
  out->set_model_name(answer.model);
  out->set_model_version(absl::StrCat(answer.version));
  out->set_id(id);
  for (const RequestedOutput& want : plan.outputs) {
    auto* tensor = out->add_outputs();
    tensor->set_name(want.name());
    TensorWriter writer(Row(want.output).wire_datatype, out->add_raw_output_contents());
    WriteAnswerTensor(view, want.output, want.classification, writer);
    tensor->set_datatype(writer.datatype());
    for (int64_t d : writer.shape()) tensor->add_shape(d);
  }
}

}  // namespace qvi::oip
