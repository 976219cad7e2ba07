#include "client/faithfulness.h"

#include <cstdio>
#include <string>

namespace qvi::client {
namespace {

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string FaithfulnessHeading(const serving::v1::Faithfulness& f) {
  if (!f.measured()) return "faithfulness: " + (f.note().empty() ? std::string("not measured") : f.note());
  return "faithfulness on " + Basename(f.split()) + ": " + std::to_string(f.answers()) + " answers in " +
         std::to_string(f.texts()) + " texts, tokens " + (f.removal() == "pad" ? "replaced by [PAD]" : "deleted") +
         ", " + f.target() + (f.cost_machine().empty() ? "" : "; costs measured on " + f.cost_machine());
}

std::vector<std::string> FaithfulnessLines(const serving::v1::Faithfulness& f) {
  std::vector<std::string> lines;
  if (!f.measured()) return lines;
  double random = -1;
  for (const auto& m : f.methods())
    if (m.method() == "random") random = m.comprehensiveness().mean();
  for (const auto& m : f.methods()) {
    const auto& c = m.comprehensiveness();
    std::string line = m.name() + ": comprehensiveness AOPC " + Fixed(c.mean(), 3) + " [" + Fixed(c.low(), 3) + ", " +
                       Fixed(c.high(), 3) + "]";
    if (m.method() == "random") {
      line += " (the floor)";
    } else if (random >= 0) {
      line += ", random " + Fixed(random, 3);
    }
    line += "; sufficiency " + Fixed(m.sufficiency().mean(), 3);
    if (m.has_loo_spearman()) line += "; leave-one-out agreement ρ " + Fixed(m.loo_spearman().mean(), 2);
    if (m.has_cost()) {
      const auto& cost = m.cost();
      line += "; cost " + Fixed(cost.ms_per_text_batch_1(), 2) + " ms/text alone, " +
              Fixed(cost.ms_per_text_batch_32(), 2) + " in batches of 32, +" +
              Fixed(cost.extra_forwards_per_text(), 1) + " forwards";
    }
    lines.push_back(line);
  }
  return lines;
}

const serving::v1::MethodFaithfulness* CardMethod(const serving::v1::Faithfulness& f, const std::string& method) {
  if (!f.measured()) return nullptr;
  const std::string older = method == "contribution" ? "alpha_value" : method == "occlusion" ? "leave_one_out" : "";
  for (const std::string& id : {method, older}) {
    if (id.empty()) continue;
    for (const auto& m : f.methods())
      if (m.method() == id) return &m;
  }
  return nullptr;
}

std::string MethodFigure(const serving::v1::Faithfulness& f, const std::string& method) {
  const serving::v1::MethodFaithfulness* m = CardMethod(f, method);
  if (m == nullptr) return "";
  const serving::v1::MethodFaithfulness* alpha = CardMethod(f, "alpha");
  std::string figure = "comprehensiveness " + Fixed(m->comprehensiveness().mean(), 3);
  if (method != "alpha" && alpha != nullptr && alpha->comprehensiveness().mean() > 0)
    figure += ", " + Fixed(m->comprehensiveness().mean() / alpha->comprehensiveness().mean(), 1) + "× α";
  return figure;
}

std::vector<float> LabelOcclusion(const serving::v1::Classification& r, int label) {
  std::vector<float> drops;
  for (const auto& t : r.tokens()) {
    if (label >= t.occlusion_size()) return {};
    drops.push_back(t.occlusion(label));
  }
  return drops;
}

}  // namespace qvi::client
