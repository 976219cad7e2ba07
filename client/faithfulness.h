// The model card's faithfulness figures (GetModel's Faithfulness) as people read them: a heading
// and one line per explanation method, for qvi-client's terminal and its HTML report.
#ifndef QVI_CLIENT_FAITHFULNESS_H_
#define QVI_CLIENT_FAITHFULNESS_H_

#include <string>
#include <vector>

#include "qvi/serving/v1/inference.pb.h"

namespace qvi::client {

// "faithfulness on test.tsv: 1066 answers in 1066 texts, tokens deleted, p(predicted label)", or
// "faithfulness: not measured ..." (the server's note) when the card has no figures.
std::string FaithfulnessHeading(const serving::v1::Faithfulness& f);

// One line per method, e.g. "α: comprehensiveness AOPC 0.120 [0.084, 0.153], random 0.038;
// sufficiency 0.127; leave-one-out agreement ρ 0.25". Empty when not measured.
std::vector<std::string> FaithfulnessLines(const serving::v1::Faithfulness& f);

// The card's figures for one method (a card id: "alpha", "contribution", "occlusion", ...), or null
// when the card has none. Cards measured before the served methods were name them by their offline
// twins, which compute the same values: "alpha_value" for "contribution", "leave_one_out" for
// "occlusion"; those are found too.
const serving::v1::MethodFaithfulness* CardMethod(const serving::v1::Faithfulness& f, const std::string& method);

// The card's figure for one served method, as a row of the report labels itself: "comprehensiveness
// 0.396, 2.6× α" (the ratio only for methods other than "alpha", when the card has α). Empty when the
// card has no figure for it.
std::string MethodFigure(const serving::v1::Faithfulness& f, const std::string& method);

// options.occlusion of a classifier's answer: returned label `label`'s drop per token; empty when the
// answer has none (not asked for, or a text of one token).
std::vector<float> LabelOcclusion(const serving::v1::Classification& r, int label);

}  // namespace qvi::client

#endif  // QVI_CLIENT_FAITHFULNESS_H_
