#include "client/html_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "client/faithfulness.h"

namespace qvi::client {
namespace v1 = serving::v1;

namespace {

using Tokens = google::protobuf::RepeatedPtrField<v1::Token>;

std::string Fixed(double v, int digits = 4) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

constexpr char kStyle[] = R"(
body { font: 15px/1.5 system-ui, sans-serif; margin: 2em auto; max-width: 70em; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; border-top: 1px solid #ddd; padding-top: 1em; }
.meta, .note { color: #666; font-size: 0.9em; }
.labels .label { display: inline-block; margin-right: 1em; } .labels .top { font-weight: bold; }
.bar { display: inline-block; height: 0.7em; background: #4a7; margin-left: 0.3em; vertical-align: middle; }
.row { margin: 0.4em 0; } .row-title { display: inline-block; width: 7.5em; color: #555; font-size: 0.9em; }
.tok { display: inline-block; padding: 0.1em 0.25em; margin: 0.1em; border-radius: 3px; border: 1px solid #eee; cursor: default; }
.source { font-size: 1.05em; } mark { padding: 0.1em 0.2em; border-radius: 3px; background: #fde68a; }
mark .ent-label { font-size: 0.7em; font-weight: bold; margin-left: 0.3em; color: #7c2d12; }
.maps { display: flex; flex-wrap: wrap; gap: 1.5em; } figure { margin: 0; } figcaption { font-size: 0.85em; color: #555; }
table.map { border-collapse: collapse; font-size: 0.7em; } table.map td { width: 1.6em; height: 1.6em; border: 1px solid #f4f4f4; }
table.map th { font-weight: normal; padding: 0 0.3em; white-space: nowrap; }
table.map th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }
#status { position: sticky; bottom: 0; background: #fafafa; border-top: 1px solid #ddd; padding: 0.4em; font-family: monospace; }
#errors { color: #b00; }
.faithfulness { color: #444; font-size: 0.9em; } .faithfulness ul { margin: 0.3em 0; }
)";

// Runs before anything else, so that any script error is on the page (the browser test reads it).
constexpr char kHeadScript[] = R"(window.addEventListener('error', function (e) {
  var el = document.getElementById('errors');
  if (el) el.textContent += 'script error: ' + e.message + '\n';
  document.documentElement.setAttribute('data-script-errors', 'yes');
});)";

constexpr char kBodyScript[] = R"((function () {
  var status = document.getElementById('status');
  document.querySelectorAll('[data-info]').forEach(function (el) {
    el.addEventListener('mouseenter', function () { status.textContent = el.getAttribute('data-info'); });
  });
  document.body.setAttribute('data-ready', 'yes');
})();)";

// A token coloured by a weight in [0, 1]: α red, β blue, λ green.
std::string Tok(const v1::Token& t, double weight, const char* rgb, const std::string& info) {
  weight = std::clamp(weight, 0.0, 1.0);
  return "<span class=\"tok\" style=\"background: rgba(" + std::string(rgb) + ", " + Fixed(weight, 3) +
         ")\" data-info=\"" + HtmlEscape(info) + "\">" + HtmlEscape(t.text()) + "</span>";
}

std::string TokenInfo(const v1::Token& t) {
  std::string info = "\"" + t.text() + "\" [" + std::to_string(t.start()) + "," + std::to_string(t.end()) + ")";
  if (!t.tag().empty()) info += "  tag " + t.tag();
  if (t.has_attention()) info += "  α=" + Fixed(t.attention());
  if (t.has_gate()) info += "  β=" + Fixed(t.gate());
  if (t.has_lambda_q()) info += "  λq=" + Fixed(t.lambda_q()) + " λk=" + Fixed(t.lambda_k());
  if (t.has_sentence_attention()) info += "  sentence α=" + Fixed(t.sentence_attention());
  return info;
}

// One heat-map row; `get` returns the weight or a negative number when the token has none.
template <typename Get>
void HeatRow(std::ostringstream& out, const Tokens& tokens, const char* title, const char* rgb, bool scale_to_max,
             Get get) {
  double max = 0;
  bool any = false;
  for (const auto& t : tokens) {
    const double w = get(t);
    if (w >= 0) any = true;
    max = std::max(max, w);
  }
  if (!any) return;
  out << "<div class=\"row heat\" data-kind=\"" << title << "\"><span class=\"row-title\">" << title << "</span>";
  for (const auto& t : tokens) {
    const double w = get(t);
    out << Tok(t, w < 0 ? 0 : (scale_to_max && max > 0 ? w / max : w), rgb, TokenInfo(t));
  }
  out << "</div>\n";
}

void Heatmaps(std::ostringstream& out, const Tokens& tokens) {
  HeatRow(out, tokens, "α attention", "220, 38, 38", true,
          [](const v1::Token& t) { return t.has_attention() ? t.attention() : -1.0; });
  HeatRow(out, tokens, "β gate", "37, 99, 235", false,
          [](const v1::Token& t) { return t.has_gate() ? t.gate() : -1.0; });
  HeatRow(out, tokens, "sentence α", "220, 38, 38", true,
          [](const v1::Token& t) { return t.has_sentence_attention() ? t.sentence_attention() : -1.0; });
  HeatRow(out, tokens, "sentence β", "37, 99, 235", false,
          [](const v1::Token& t) { return t.has_sentence_gate() ? t.sentence_gate() : -1.0; });
  HeatRow(out, tokens, "λ_Q", "22, 163, 74", false,
          [](const v1::Token& t) { return t.has_lambda_q() ? t.lambda_q() : -1.0; });
  HeatRow(out, tokens, "λ_K", "22, 163, 74", false,
          [](const v1::Token& t) { return t.has_lambda_k() ? t.lambda_k() : -1.0; });
  if (!tokens.empty()) {
    out << "<p class=\"note\">α is scaled to the text's largest weight; β and λ are shown as they are, in (0, 1). "
           "Hover a token for its numbers.</p>\n";
  }
}

std::string MapCaption(const v1::LayerMap& m) {
  std::string layer = m.layer() < 0 ? "all layers" : "layer " + std::to_string(m.layer());
  std::string head = m.head() < 0 ? "mean of heads" : "head " + std::to_string(m.head());
  return layer + ", " + head;
}

void LayerMaps(std::ostringstream& out, const Tokens& tokens,
               const google::protobuf::RepeatedPtrField<v1::LayerMap>& maps) {
  const int n = tokens.size();
  bool any_map = false;
  for (const auto& m : maps) any_map = any_map || m.attention_size() == n * n;
  if (any_map && n > 0) {
    out << "<h3>Self-attention maps</h3><p class=\"note\">Row: the query token; column: the key token it attends "
           "to. Darker is more attention, scaled to each map's largest weight.</p><div class=\"maps\">\n";
    for (const auto& m : maps) {
      if (m.attention_size() != n * n) continue;
      float max = 1e-9f;  // each map scaled to its largest weight, as α is
      for (float a : m.attention()) max = std::max(max, a);
      out << "<figure><figcaption>" << HtmlEscape(MapCaption(m)) << "</figcaption><table class=\"map\"><tr><th></th>";
      for (const auto& t : tokens) out << "<th class=\"col\">" << HtmlEscape(t.text()) << "</th>";
      out << "</tr>\n";
      for (int q = 0; q < n; ++q) {
        out << "<tr><th>" << HtmlEscape(tokens[q].text()) << "</th>";
        for (int k = 0; k < n; ++k) {
          const float a = m.attention(q * n + k);
          out << "<td style=\"background: rgba(124, 58, 237, " << Fixed(std::clamp<double>(a / max, 0, 1), 3)
              << ")\" data-info=\""
              << HtmlEscape(MapCaption(m) + ": " + tokens[q].text() + " → " + tokens[k].text() + "  " + Fixed(a))
              << "\"></td>";
        }
        out << "</tr>\n";
      }
      out << "</table></figure>\n";
    }
    out << "</div>\n";
  }
  bool any_gates = false;
  for (const auto& m : maps) any_gates = any_gates || m.gates_size() == n;
  if (any_gates && n > 0) {
    out << "<h3>Gates per layer</h3>\n";
    for (const auto& m : maps) {
      if (m.gates_size() != n) continue;
      out << "<div class=\"row\"><span class=\"row-title\">" << HtmlEscape(MapCaption(m)) << "</span>";
      for (int i = 0; i < n; ++i) {
        out << Tok(tokens[i], m.gates(i), "37, 99, 235", MapCaption(m) + ": β=" + Fixed(m.gates(i)));
      }
      out << "</div>\n";
    }
  }
}

std::string Header(const v1::ModelVersion& model, const std::string& name, const std::string& what) {
  const v1::ModelMetadata& md = model.metadata();
  std::ostringstream out;
  out << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      << "<title>" << HtmlEscape(name) << "@" << model.version() << ": why the model " << what << "</title>"
      << "<script>" << kHeadScript << "</script><style>" << kStyle << "</style></head><body>\n"
      << "<h1>Why " << HtmlEscape(name) << " " << what << "</h1>\n"
      << "<p class=\"meta\">" << HtmlEscape(name) << " version " << model.version() << " · "
      << HtmlEscape(md.display_name()) << " (" << HtmlEscape(md.architecture()) << ", interaction "
      << HtmlEscape(md.interaction()) << ") · " << HtmlEscape(md.task())
      << ". The weights below come from the same forward pass that produced the answer.</p>\n";
  // How far to trust them: the card's faithfulness figures, one line per method (docs/serving.md).
  out << "<details class=\"faithfulness\"><summary>" << HtmlEscape(FaithfulnessHeading(md.faithfulness()))
      << "</summary><ul>";
  for (const std::string& line : FaithfulnessLines(md.faithfulness())) out << "<li>" << HtmlEscape(line) << "</li>";
  out << "</ul></details>\n<pre id=\"errors\"></pre>\n";
  return out.str();
}

std::string Footer() {
  return std::string("<div id=\"status\">Hover a token or a map cell.</div>\n<script>") + kBodyScript +
         "</script></body></html>\n";
}

}  // namespace

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string HtmlReport(const v1::ModelVersion& model, const std::string& name, const std::vector<std::string>& texts,
                       const v1::ClassifyResponse& response) {
  std::ostringstream out;
  out << Header(model, name, "chose its labels");
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::Classification& r = response.results(i);
    out << "<section class=\"text\" id=\"text-" << i << "\"><h2>Text " << i + 1 << "</h2>\n<p class=\"source\">"
        << HtmlEscape(i < static_cast<int>(texts.size()) ? texts[i] : "") << "</p>\n<p class=\"labels\">";
    for (int l = 0; l < r.labels_size(); ++l) {
      out << "<span class=\"label" << (l == 0 ? " top" : "") << "\">" << HtmlEscape(r.labels(l).label()) << " "
          << Fixed(r.labels(l).score(), 3) << "<span class=\"bar\" style=\"width: " << Fixed(r.labels(l).score() * 8, 2)
          << "em\"></span></span>";
    }
    out << "</p>\n";
    if (r.truncated())
      out << "<p class=\"note\">Truncated: the model read the first tokens of " << r.num_tokens() << ".</p>\n";
    Heatmaps(out, r.tokens());
    LayerMaps(out, r.tokens(), r.layers());
    out << "</section>\n";
  }
  out << Footer();
  return out.str();
}

std::string HtmlReport(const v1::ModelVersion& model, const std::string& name, const std::vector<std::string>& texts,
                       const v1::TagResponse& response) {
  std::ostringstream out;
  out << Header(model, name, "tagged these entities");
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::Tagging& r = response.results(i);
    const std::string text = i < static_cast<int>(texts.size()) ? texts[i] : "";
    out << "<section class=\"text\" id=\"text-" << i << "\"><h2>Text " << i + 1 << "</h2>\n<p class=\"source spans\">";
    // The spans over the original text, sliced by their UTF-8 byte offsets.
    size_t at = 0;
    for (const v1::Span& s : r.spans()) {
      if (s.byte_start() < at || s.byte_end() > text.size() || s.byte_start() > s.byte_end()) continue;
      out << HtmlEscape(text.substr(at, s.byte_start() - at)) << "<mark class=\"ent\" data-info=\""
          << HtmlEscape(s.label() + " " + Fixed(s.score(), 3) + " [" + std::to_string(s.start()) + "," +
                        std::to_string(s.end()) + ")")
          << "\">" << HtmlEscape(text.substr(s.byte_start(), s.byte_end() - s.byte_start()))
          << "<span class=\"ent-label\">" << HtmlEscape(s.label()) << "</span></mark>";
      at = s.byte_end();
    }
    out << HtmlEscape(text.substr(std::min(at, text.size()))) << "</p>\n";
    if (r.spans_size() == 0) out << "<p class=\"note\">No entities.</p>\n";
    Heatmaps(out, r.tokens());
    LayerMaps(out, r.tokens(), r.layers());
    out << "</section>\n";
  }
  out << Footer();
  return out.str();
}

}  // namespace qvi::client
