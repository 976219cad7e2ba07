// qvi-client's output for a person at a terminal: heat-maps of the explanations over the tokens (α
// red, β blue; contributions and occlusion in two colours, green for and magenta against) when the
// terminal allows colour, else the values written after each token.
#ifndef QVI_CLIENT_TERMINAL_H_
#define QVI_CLIENT_TERMINAL_H_

#include "qvi/serving/v1/inference.pb.h"

namespace qvi::client {

// options.contributions: for each returned label, its tokens' shares of its margin, and how the margin
// adds up (tokens + rest).
void PrintContributions(const serving::v1::Classification& r, bool color);
// options.occlusion of a classifier: for each returned label, its probability's drop without each token.
void PrintOcclusion(const serving::v1::Classification& r, bool color);
// options.occlusion of a tagger: for each entity, its probability's drop without each token around it.
void PrintEntityOcclusion(const serving::v1::Tagging& r, bool color);
// α and β rows over the tokens (colour), then one line per token with its numbers.
void PrintTokens(const google::protobuf::RepeatedPtrField<serving::v1::Token>& tokens, bool color);

// --layer-gates / --attention-maps: per returned layer and head, its gates per token and, for a map,
// each token's three most attended keys with their weights.
void PrintLayers(const google::protobuf::RepeatedPtrField<serving::v1::LayerMap>& layers,
                 const google::protobuf::RepeatedPtrField<serving::v1::Token>& tokens);

// One text's classification as qvi-client prints it: its labels, label set and abstention (`abstain_below`:
// the threshold asked for), the faithfulness check, contributions, occlusion, the tokens when `show_tokens`,
// and the layers.
void PrintClassification(const serving::v1::Classification& r, bool show_tokens, double abstain_below, bool color);

}  // namespace qvi::client

#endif  // QVI_CLIENT_TERMINAL_H_
