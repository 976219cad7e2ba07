// The model outputs each request option of the native API turns on, by the names a model's metadata
// lists them under: qvi-client asks for an option when the model has any of its outputs. The
// server's output catalogue (server/core/outputs/outputs.cc) is where they are defined; the client
// does not link the server, so tests/cpp/frontend/outputs_test.cc checks these lists against it.
#ifndef QVI_CLIENT_OUTPUT_NAMES_H_
#define QVI_CLIENT_OUTPUT_NAMES_H_

#include <string_view>
#include <vector>

namespace qvi::client {

// options.attention
inline const std::vector<std::string_view> kAttentionOutputs = {"attention", "sentence_attention"};
// options.gates
inline const std::vector<std::string_view> kGateOutputs = {"gates", "sentence_gates", "lambda_q", "lambda_k"};
// options.layers.gates
inline const std::vector<std::string_view> kLayerGateOutputs = {"layer_gates", "layer_lambda_q", "layer_lambda_k"};
// options.contributions (margin and contribution_rest come with them; no model lists those)
inline const std::vector<std::string_view> kContributionOutputs = {"contribution", "sentence_contribution", "margin",
                                                                   "contribution_rest"};
// options.layers.attention_maps
inline const std::vector<std::string_view> kLayerAttentionOutputs = {"layer_attention"};

}  // namespace qvi::client

#endif  // QVI_CLIENT_OUTPUT_NAMES_H_
