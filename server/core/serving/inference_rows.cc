// InferenceService's answers from their rows of outputs: a text's post-processing (a sub-word model's
// grouped into words first, subwords.h), and options.occlusion's values once every row is done.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/core/base/exception_text.h"
#include "server/core/request/request_checks.h"
#include "server/core/serving/inference_service.h"
#include "server/core/serving/occlusion.h"
#include "server/core/serving/postprocess.h"
#include "server/core/serving/subwords.h"
#include "server/core/serving/trust.h"

namespace qvi {
namespace {

// options.faithfulness's answer from the runner's second forward (ModelRunner::RunChecks).
FaithfulnessCheckOutput CheckOutput(const Manifest& m, const ModelOutputs& outputs, int64_t row, double temperature) {
  const int64_t check = outputs.check_row.at(static_cast<size_t>(row));
  if (check < 0) throw std::logic_error("a text that asked for the faithfulness check has no check row");
  // The same probabilities as the answer's labels (TopK): its top label and score, and that label's
  // probability in the check's forward.
  const std::vector<float> before = SoftmaxRow(outputs.at(Output::kLogits), row, temperature);
  const std::vector<float> after = SoftmaxRow(outputs.check_logits, check, temperature);
  if (before.empty() || after.size() != before.size()) throw std::logic_error("the check's logits do not match");
  // The first of the largest, as TopK's stable sort picks it.
  const size_t best = static_cast<size_t>(std::max_element(before.begin(), before.end()) - before.begin());
  FaithfulnessCheckOutput f;
  f.label = m.labels.at(best);
  f.score = before[best];
  f.score_without = after[best];
  for (int64_t i : outputs.check_removed.at(static_cast<size_t>(row))) f.removed.push_back(static_cast<uint32_t>(i));
  return f;
}

}  // namespace

absl::Status InferenceService::FillOcclusion(const OcclusionRecord& record, int texts, bool subword_view,
                                             InferenceResponse& response) {
  try {
    for (int i = 0; i < texts; ++i) {
      TextResult& result = response.results[static_cast<size_t>(i)];
      if (!subword_view || result.words.empty()) {
        record.Fill(i, result);
        continue;
      }
      // The values are the words': filled over the word view, then shown on each sub-word of the word.
      TextResult words;
      words.labels = result.labels;
      words.tokens = WordTokens(result.words, result.tokens);
      auto word_of = [&result](uint32_t position) { return result.tokens.at(position).word.value_or(-1); };
      for (const SpanOutput& s : result.spans) {
        SpanOutput& w = words.spans.emplace_back();
        w.token_start = static_cast<uint32_t>(word_of(s.token_start));
        w.token_end = static_cast<uint32_t>(word_of(s.token_end - 1) + 1);
      }
      record.Fill(i, words);
      for (TokenOutput& t : result.tokens) {
        if (t.word.value_or(-1) >= 0) t.occlusion = words.tokens.at(static_cast<size_t>(*t.word)).occlusion;
      }
      for (size_t e = 0; e < result.spans.size(); ++e) {
        SpanOutput& s = result.spans[e];
        s.probability = words.spans[e].probability;
        s.occlusion.assign(result.tokens.size(), 0.0F);
        for (size_t p = 0; p < result.tokens.size(); ++p) {
          const int32_t w = word_of(static_cast<uint32_t>(p));
          if (w >= 0) s.occlusion[p] = words.spans[e].occlusion.at(static_cast<size_t>(w));
        }
      }
    }
  } catch (...) {
    return absl::InternalError(absl::StrCat("options.occlusion failed: ", CurrentExceptionText()));
  }
  return absl::OkStatus();
}

void InferenceService::PostProcessRow(Method method, const Model& model, const OutputOptions& o,
                                      const std::string& text, const ModelOutputs& outputs, int64_t row,
                                      TextResult& result) {
  const Manifest& m = model.manifest();
  if (!m.subwords()) return PostProcessTokens(method, model, o, text, outputs, row, result);
  const ModelOutputs words = FoldToWords(outputs, row, result.words, WantedOutputs(m, o));
  std::vector<TokenOutput> subwords = std::move(result.tokens);
  result.tokens = WordTokens(result.words, subwords);
  if (!o.subwords) return PostProcessTokens(method, model, o, text, words, 0, result);
  // The sub-word view: entities from the words' tags, everything else per position.
  if (method == Method::kTag) {
    OutputOptions spans_only;
    spans_only.raw_scores = o.raw_scores;
    spans_only.abstain_below = o.abstain_below;
    PostProcessTokens(method, model, spans_only, text, words, 0, result);
  }
  std::vector<SpanOutput> spans = std::move(result.spans);
  SpansOnSubwords(result.words, spans);
  result.tokens = std::move(subwords);
  result.spans.clear();
  PostProcessTokens(method, model, o, text, outputs, row, result);
  if (method == Method::kTag) result.spans = std::move(spans);
}

void InferenceService::PostProcessTokens(Method method, const Model& model, const OutputOptions& o,
                                         const std::string& text, const ModelOutputs& outputs, int64_t row,
                                         TextResult& result) {
  const Manifest& m = model.manifest();
  const double temperature = m.ScoreTemperature(o.raw_scores);
  if (method == Method::kClassify) {
    const std::vector<float> probabilities = SoftmaxRow(outputs.at(Output::kLogits), row, temperature);
    result.labels = TopK(probabilities, m.labels, o.top_k);
    FillLabelTrust(m, o, probabilities, result);
  } else {
    DecodeTagging(m, outputs.at(Output::kTags), outputs.at(Output::kEmissions), row, text, result, model.crf(),
                  temperature, o.tag_probabilities);
    FillSpanTrust(o, result);
  }
  if (o.faithfulness_top_k > 0) result.faithfulness = CheckOutput(m, outputs, row, temperature);
  FillTokenExplanations(outputs, o, row, result);
  if (method == Method::kClassify && o.Asks(OutputSwitch::kContributions)) FillContributions(m, outputs, row, result);
  if (o.AsksLayers()) result.layers = LayerMaps(outputs, o, row, static_cast<int64_t>(result.tokens.size()));
  // A sub-word model's sub-word view is asked for to see the sub-words: they stay.
  if (method != Method::kTag && !o.AsksPerToken() && !(o.subwords && m.subwords())) result.tokens.clear();
}

}  // namespace qvi
