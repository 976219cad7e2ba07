#include "client/shadow.h"

#include <iomanip>
#include <string>

namespace qvi::client {
namespace {

namespace v1 = ::qvi::serving::v1;

std::string Shown(const v1::ShadowComparison::Disagreement& d) {
  if (!d.text().empty()) return "\"" + (d.text().size() > 70 ? d.text().substr(0, 67) + "..." : d.text()) + "\"";
  return "sha256:" + d.text_sha256().substr(0, 12);
}

void PrintOne(const v1::ShadowComparison& c, std::ostream& out) {
  out << "  version " << c.live_version() << " serving, version " << c.shadow_version() << " its candidate (fraction "
      << c.fraction() << ")\n";
  out << "    texts mirrored " << c.mirrored_texts() << ", compared " << c.compared_texts();
  for (const auto& [reason, texts] : c.dropped_texts()) out << ", dropped " << reason << " " << texts;
  out << "\n" << std::fixed << std::setprecision(3);
  out << "    label agreement " << c.label_agreement();
  for (const auto& f : c.flips()) out << "  " << f.from() << " -> " << f.to() << ": " << f.texts();
  out << "\n";
  if (c.has_span_f1()) out << "    span F1 " << c.span_f1() << "\n";
  if (c.has_mean_rank_correlation())
    out << "    mean rank correlation of the explanations " << c.mean_rank_correlation() << "\n";
  if (c.has_mean_score_difference()) {
    out << "    mean score difference " << c.mean_score_difference() << " (absolute " << c.mean_abs_score_difference()
        << ")\n";
  }
  if (c.has_mean_latency_difference_ms()) {
    out << "    mean compute time difference " << c.mean_latency_difference_ms() << " ms\n";
  }
  if (c.disagreements_size() > 0) out << "    the texts that disagree most:\n";
  for (const auto& d : c.disagreements()) {
    out << "      " << (d.live_label().empty() ? "spans" : d.live_label() + " -> " + d.shadow_label());
    if (d.live_label().empty()) out << " " << d.same_spans() << " of " << d.live_spans() << "/" << d.shadow_spans();
    if (d.has_score_difference()) out << "  score " << std::showpos << d.score_difference() << std::noshowpos;
    if (d.has_rank_correlation()) out << "  rho " << d.rank_correlation();
    out << "  " << Shown(d) << "\n";
  }
  out << std::defaultfloat;
}

}  // namespace

int PrintShadow(const v1::GetModelResponse& model, std::ostream& out) {
  out << model.model().name() << ":\n";
  if (model.shadow_size() == 0) {
    out << "  no shadow candidate (serving.json's \"shadow\" names one)\n";
    return 3;
  }
  for (const v1::ShadowComparison& c : model.shadow()) PrintOne(c, out);
  return 0;
}

}  // namespace qvi::client
