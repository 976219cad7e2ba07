// qvi-client's HTML report: one self-contained page (inline CSS and a few lines of script, nothing
// fetched) that shows why the model answered as it did — per text, the labels or the entity spans
// over the original text, α and β (and λ, and HAN's sentence weights) as heat-maps over the
// tokens, and the Transformer's per-layer attention maps as grids.
#ifndef QVI_CLIENT_HTML_REPORT_H_
#define QVI_CLIENT_HTML_REPORT_H_

#include <string>
#include <vector>

#include "qvi/serving/v1/inference.pb.h"

namespace qvi::client {

// Every user-given string on the page goes through this.
std::string HtmlEscape(const std::string& s);

std::string HtmlReport(const serving::v1::ModelVersion& model, const std::string& model_name,
                       const std::vector<std::string>& texts, const serving::v1::ClassifyResponse& response);
std::string HtmlReport(const serving::v1::ModelVersion& model, const std::string& model_name,
                       const std::vector<std::string>& texts, const serving::v1::TagResponse& response);

}  // namespace qvi::client

#endif  // QVI_CLIENT_HTML_REPORT_H_
