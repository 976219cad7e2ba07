#include "server/core/outputs/answer_tensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace qvi {
namespace {

// "N,C" -> {-1, labels}: the shape ModelMetadata gives (N, T, K and M are any size).
std::vector<int64_t> SymbolicShape(const char* shape, const Manifest& m) {
  std::vector<int64_t> out;
  for (absl::string_view d : absl::StrSplit(shape, ',')) {
    if (d == "C") {
      out.push_back(static_cast<int64_t>(m.labels.size()));
    } else if (d == "2") {
      out.push_back(2);
    } else {
      out.push_back(-1);
    }
  }
  return out;
}

nlohmann::json SpansJson(const std::vector<SpanOutput>& spans) {
  nlohmann::json out = nlohmann::json::array();
  for (const SpanOutput& s : spans) {
    out.push_back({{"label", s.label},
                   {"start", s.start},
                   {"end", s.end},
                   {"text", s.text},
                   {"score", s.score},
                   {"byte_start", s.byte_start},
                   {"byte_end", s.byte_end},
                   {"token_start", s.token_start},
                   {"token_end", s.token_end}});
    if (s.probability) out.back()["probability"] = *s.probability;  // options.occlusion's baseline
    if (s.abstained) out.back()["abstained"] = true;                // options.abstain_below
  }
  return out;
}

// Elements of a [N, T] tensor: `value(result, token)` for each text's tokens, `pad` after them.
template <typename Value, typename Pad>
void ForEachTokenCell(const AnswerView& v, Value value, Pad pad) {
  for (const TextResult& r : v.answer.results) {
    for (int64_t j = 0; j < v.max_tokens; ++j) {
      if (j < static_cast<int64_t>(r.tokens.size())) {
        value(r.tokens[static_cast<size_t>(j)]);
      } else {
        pad();
      }
    }
  }
}

}  // namespace

TensorSpec TextInput() { return {"text", "BYTES", {-1}}; }

bool HasWireOutput(const Manifest& m, Output output) {
  const OutputRow& row = Row(output);
  if (output == Output::kWordIndex && !m.subwords()) return false;  // the others' tokens are their words
  return row.wire_datatype != nullptr && ForTask(row, m.task) &&
         (!row.requires_output || HasOutput(m, *row.requires_output));
}

std::vector<TensorSpec> WireOutputs(const Manifest& m) {
  std::vector<TensorSpec> specs;
  for (const OutputRow& row : OutputCatalogue()) {
    if (HasWireOutput(m, row.id)) specs.push_back({row.name, row.wire_datatype, SymbolicShape(row.wire_shape, m)});
  }
  return specs;
}

std::vector<Output> DefaultWireOutputs(const Manifest& m, const OutputSet& asked) {
  // Any per-token output in the answer brings token_count; any per-layer one, layer_index.
  const bool per_token = m.task == Task::kTagging || AnySwitchedBy(asked, OutputSwitch::kTokens) ||
                         AnySwitchedBy(asked, OutputSwitch::kAttention) || AnySwitchedBy(asked, OutputSwitch::kGates) ||
                         AnySwitchedBy(asked, OutputSwitch::kContributions) ||
                         AnySwitchedBy(asked, OutputSwitch::kOcclusion);
  const bool layers =
      AnySwitchedBy(asked, OutputSwitch::kLayerGates) || AnySwitchedBy(asked, OutputSwitch::kLayerAttention);
  std::vector<Output> out;
  for (const OutputRow& row : OutputCatalogue()) {
    if (!HasWireOutput(m, row.id)) continue;
    bool in = false;
    switch (row.on) {
      case OutputSwitch::kAnswer:
        in = true;
        break;
      case OutputSwitch::kNamed:
        break;
      case OutputSwitch::kAnyToken:
        in = per_token;
        break;
      case OutputSwitch::kAnyLayer:
        in = layers;
        break;
      default:
        in = asked.test(static_cast<size_t>(row.id));
    }
    if (in) out.push_back(row.id);
  }
  return out;
}

AnswerView::AnswerView(const InferenceResponse& a, int k) : answer(a), manifest(*a.manifest), top_k(k) {
  texts = static_cast<int64_t>(a.results.size());
  for (const TextResult& r : a.results) {
    max_tokens = std::max<int64_t>(max_tokens, static_cast<int64_t>(r.tokens.size()));
    for (const TokenOutput& t : r.tokens) {
      token_bytes += static_cast<int64_t>(t.token.text.size());
      tag_bytes += static_cast<int64_t>(t.tag.size());
    }
    for (const auto& label : r.labels)
      label_bytes = std::max<int64_t>(label_bytes, static_cast<int64_t>(label.first.size()));
    // A span's JSON: its text and label (escaped, at most 6 bytes a byte) and the numbers and keys.
    for (const SpanOutput& sp : r.spans) span_bytes += 6 * static_cast<int64_t>(sp.text.size() + sp.label.size()) + 200;
    max_spans = std::max<int64_t>(max_spans, static_cast<int64_t>(r.spans.size()));
  }
  layer_maps = a.results.empty() ? 0 : static_cast<int64_t>(a.results[0].layers.size());
  for (size_t i = 0; i < manifest.labels.size(); ++i) label_index.emplace(manifest.labels[i], static_cast<int64_t>(i));
}

AnswerView AnswerView::Before(const InferenceResponse& tokenised, int top_k, int64_t layer_maps) {
  AnswerView v(tokenised, top_k);
  int64_t longest_tag = 0;
  for (const std::string& label : v.manifest.labels) v.label_bytes = std::max<int64_t>(v.label_bytes, label.size());
  for (const std::string& tag : v.manifest.tags) longest_tag = std::max<int64_t>(longest_tag, tag.size());
  v.tag_bytes = 0;
  v.span_bytes = 0;
  for (const TextResult& r : tokenised.results) {
    const auto n = static_cast<int64_t>(r.tokens.size());
    v.tag_bytes += n * longest_tag;
    const int64_t covered = n == 0 ? 0 : r.tokens.back().token.byte_end - r.tokens.front().token.byte_start;
    v.span_bytes += 6 * (covered + n * longest_tag) + 200 * n;  // as the constructor counts spans
    v.max_spans = std::max(v.max_spans, n);                     // at most a span per token
  }
  v.layer_maps = layer_maps;
  return v;
}

void TensorWriter::Bytes(std::string_view element) {
  const uint32_t n = static_cast<uint32_t>(element.size());
  for (int b = 0; b < 4; ++b) raw_->push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  raw_->append(element);
}

void TensorWriter::Float(float value) {
  char bytes[sizeof value];
  std::memcpy(bytes, &value, sizeof value);
  raw_->append(bytes, sizeof value);
}

void TensorWriter::Int32(int32_t value) {
  char bytes[sizeof value];
  std::memcpy(bytes, &value, sizeof value);
  raw_->append(bytes, sizeof value);
}

void WriteAnswerTensor(const AnswerView& view, Output output, int classification, TensorWriter& out) {
  const OutputRow& row = Row(output);
  row.write(view, row, classification, out);
}

int64_t AnswerTensorBytes(const AnswerView& view, Output output, int classification) {
  const OutputRow& row = Row(output);
  return 64 + row.bytes(view, row, classification);
}

namespace tensors {

void Label(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Bytes(r.labels.empty() ? "" : r.labels[0].first);
}
int64_t LabelBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * (4 + v.label_bytes); }

void Probabilities(const AnswerView& v, const OutputRow&, int classification, TensorWriter& out) {
  if (classification > 0) {  // Triton's classification extension: the K best as "score:index:label"
    const int64_t k = classification;
    out.SetDatatype("BYTES");
    out.SetShape({v.texts, k});
    for (const TextResult& r : v.answer.results) {
      for (int64_t j = 0; j < k; ++j) {
        if (j < static_cast<int64_t>(r.labels.size())) {
          const auto& [label, score] = r.labels[static_cast<size_t>(j)];
          const auto index = v.label_index.find(label);
          out.Bytes(absl::StrCat(score, ":", index == v.label_index.end() ? -1 : index->second, ":", label));
        } else {
          out.Bytes("");
        }
      }
    }
    return;
  }
  const int64_t c = static_cast<int64_t>(v.manifest.labels.size());
  out.SetShape({v.texts, c});
  for (const TextResult& r : v.answer.results) {
    std::vector<float> row(static_cast<size_t>(c), 0.0f);
    for (const auto& [label, score] : r.labels) {
      if (auto index = v.label_index.find(label); index != v.label_index.end())
        row[static_cast<size_t>(index->second)] = score;
    }
    for (float value : row) out.Float(value);
  }
}
int64_t ProbabilitiesBytes(const AnswerView& v, const OutputRow&, int classification) {
  if (classification > 0) return v.texts * classification * (4 + 32 + v.label_bytes);
  return v.texts * static_cast<int64_t>(v.manifest.labels.size()) * 4;
}

void TopLabels(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.top_k});
  for (const TextResult& r : v.answer.results) {
    for (int64_t j = 0; j < v.top_k; ++j) out.Bytes(j < static_cast<int64_t>(r.labels.size()) ? r.labels[j].first : "");
  }
}
int64_t TopLabelsBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.top_k * (4 + v.label_bytes); }

void TopScores(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.top_k});
  for (const TextResult& r : v.answer.results) {
    for (int64_t j = 0; j < v.top_k; ++j) out.Float(j < static_cast<int64_t>(r.labels.size()) ? r.labels[j].second : 0);
  }
}
int64_t TopScoresBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.top_k * 4; }

void Spans(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Bytes(SpansJson(r.spans).dump());
}
int64_t SpansBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * 6 + v.span_bytes; }

void TagNames(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.max_tokens});
  ForEachTokenCell(
      v, [&](const TokenOutput& t) { out.Bytes(t.tag); }, [&] { out.Bytes(""); });
}
int64_t TagNamesBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.max_tokens * 4 + v.tag_bytes; }

void TokenTexts(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.max_tokens});
  ForEachTokenCell(
      v, [&](const TokenOutput& t) { out.Bytes(t.token.text); }, [&] { out.Bytes(""); });
}
int64_t TokenTextsBytes(const AnswerView& v, const OutputRow&, int) {
  return v.texts * v.max_tokens * 4 + v.token_bytes;
}

void TokenCount(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  const uint32_t max_tokens = static_cast<uint32_t>(std::max(0, v.manifest.tokenizer.max_tokens));
  for (const TextResult& r : v.answer.results) {
    // A sub-word model's rows hold its words (or, asked so, its sub-words): as many as there are.
    const size_t shown = r.tokens.empty() ? r.words.size() : r.tokens.size();
    out.Int32(static_cast<int32_t>(v.manifest.subwords() ? shown : std::min(r.num_tokens, max_tokens)));
  }
}
int64_t PerTextBytes4(const AnswerView& v, const OutputRow&, int) { return v.texts * 4; }

void Truncated(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Bool(r.truncated);
}
int64_t PerTextBytes1(const AnswerView& v, const OutputRow&, int) { return v.texts; }

void WordIndex(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.max_tokens});
  for (const TextResult& r : v.answer.results) {
    for (int64_t j = 0; j < v.max_tokens; ++j) {
      const bool token = j < static_cast<int64_t>(r.tokens.size());
      out.Int32(token ? r.tokens[static_cast<size_t>(j)].word.value_or(static_cast<int32_t>(j)) : -1);
    }
  }
}

void PerToken(const AnswerView& v, const OutputRow& row, int, TensorWriter& out) {
  out.SetShape({v.texts, v.max_tokens});
  ForEachTokenCell(
      v, [&](const TokenOutput& t) { out.Float((t.*row.token_field).value_or(0.0f)); }, [&] { out.Float(0.0f); });
}
int64_t PerTokenBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.max_tokens * 4; }

void PerLabelToken(const AnswerView& v, const OutputRow& row, int, TensorWriter& out) {
  out.SetShape({v.texts, v.top_k, v.max_tokens});
  for (const TextResult& r : v.answer.results) {
    for (int64_t j = 0; j < v.top_k; ++j) {
      for (int64_t t = 0; t < v.max_tokens; ++t) {
        const std::vector<float>* values = t < static_cast<int64_t>(r.tokens.size())
                                               ? &(r.tokens[static_cast<size_t>(t)].*row.label_token_field)
                                               : nullptr;
        out.Float(values != nullptr && j < static_cast<int64_t>(values->size()) ? (*values)[static_cast<size_t>(j)]
                                                                                : 0.0f);
      }
    }
  }
}
int64_t PerLabelTokenBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.top_k * v.max_tokens * 4; }

void EntityOcclusion(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts, v.max_spans, v.max_tokens});
  for (const TextResult& r : v.answer.results) {
    for (int64_t s = 0; s < v.max_spans; ++s) {
      const std::vector<float>* values =
          s < static_cast<int64_t>(r.spans.size()) ? &r.spans[static_cast<size_t>(s)].occlusion : nullptr;
      for (int64_t t = 0; t < v.max_tokens; ++t) {
        out.Float(values != nullptr && t < static_cast<int64_t>(values->size()) ? (*values)[static_cast<size_t>(t)]
                                                                                : 0.0f);
      }
    }
  }
}
int64_t EntityOcclusionBytes(const AnswerView& v, const OutputRow&, int) {
  return v.texts * v.max_spans * v.max_tokens * 4;
}

namespace {
void PerLabel(const AnswerView& v, std::vector<float> TextResult::*field, TensorWriter& out) {
  out.SetShape({v.texts, v.top_k});
  for (const TextResult& r : v.answer.results) {
    const std::vector<float>& values = r.*field;
    for (int64_t j = 0; j < v.top_k; ++j) {
      out.Float(j < static_cast<int64_t>(values.size()) ? values[static_cast<size_t>(j)] : 0.0f);
    }
  }
}
}  // namespace

void Margins(const AnswerView& v, const OutputRow&, int, TensorWriter& out) { PerLabel(v, &TextResult::margins, out); }
void ContributionRests(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  PerLabel(v, &TextResult::contribution_rest, out);
}
int64_t PerLabelBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.top_k * 4; }

void LayerIndex(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.layer_maps, 2});
  if (v.answer.results.empty()) return;
  for (const LayerMapOutput& l : v.answer.results[0].layers) {
    out.Int32(static_cast<int32_t>(l.layer));
    out.Int32(static_cast<int32_t>(l.head));
  }
}
int64_t LayerIndexBytes(const AnswerView& v, const OutputRow&, int) { return v.layer_maps * 8; }

void PerLayer(const AnswerView& v, const OutputRow& row, int, TensorWriter& out) {
  out.SetShape({v.texts, v.layer_maps, v.max_tokens});
  for (const TextResult& r : v.answer.results) {
    for (int64_t l = 0; l < v.layer_maps; ++l) {
      const std::vector<float>* values =
          l < static_cast<int64_t>(r.layers.size()) ? &(r.layers[static_cast<size_t>(l)].*row.layer_field) : nullptr;
      for (int64_t j = 0; j < v.max_tokens; ++j) {
        out.Float(values != nullptr && j < static_cast<int64_t>(values->size()) ? (*values)[static_cast<size_t>(j)]
                                                                                : 0.0f);
      }
    }
  }
}
int64_t PerLayerBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * v.layer_maps * v.max_tokens * 4; }

void PerLayerMap(const AnswerView& v, const OutputRow& row, int, TensorWriter& out) {
  const int64_t t_max = v.max_tokens;
  out.SetShape({v.texts, v.layer_maps, t_max, t_max});
  for (const TextResult& r : v.answer.results) {
    const int64_t t = static_cast<int64_t>(r.tokens.size());
    for (int64_t l = 0; l < v.layer_maps; ++l) {
      const std::vector<float>* map =
          l < static_cast<int64_t>(r.layers.size()) ? &(r.layers[static_cast<size_t>(l)].*row.layer_field) : nullptr;
      for (int64_t q = 0; q < t_max; ++q) {
        for (int64_t k = 0; k < t_max; ++k) {
          const size_t at = static_cast<size_t>(q * t + k);
          out.Float(map != nullptr && q < t && k < t && at < map->size() ? (*map)[at] : 0.0f);
        }
      }
    }
  }
}
int64_t PerLayerMapBytes(const AnswerView& v, const OutputRow&, int) {
  return v.texts * v.layer_maps * v.max_tokens * v.max_tokens * 4;
}

void LabelSets(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) {
    nlohmann::json set = nlohmann::json::array();
    if (r.label_set) {
      for (const std::string& label : r.label_set->labels) set.push_back(label);
    }
    out.Bytes(set.dump());
  }
}
// Every label, quoted and escaped (at most 6 bytes a byte), and the list's brackets and commas.
int64_t LabelSetBytes(const AnswerView& v, const OutputRow&, int) {
  int64_t all = 2;
  for (const std::string& label : v.manifest.labels) all += 6 * static_cast<int64_t>(label.size()) + 3;
  return v.texts * (4 + all);
}

void Abstained(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Bool(r.abstained);
}

void FaithfulnessLabel(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Bytes(r.faithfulness ? r.faithfulness->label : "");
}

void FaithfulnessScore(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Float(r.faithfulness ? r.faithfulness->score : 0.0f);
}

void FaithfulnessScoreWithout(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  out.SetShape({v.texts});
  for (const TextResult& r : v.answer.results) out.Float(r.faithfulness ? r.faithfulness->score_without : 0.0f);
}

namespace {
int64_t MostRemoved(const AnswerView& v) {
  int64_t most = 0;
  for (const TextResult& r : v.answer.results) {
    if (r.faithfulness) most = std::max<int64_t>(most, static_cast<int64_t>(r.faithfulness->removed.size()));
  }
  return most;
}
}  // namespace

void FaithfulnessRemoved(const AnswerView& v, const OutputRow&, int, TensorWriter& out) {
  const int64_t most = MostRemoved(v);
  out.SetShape({v.texts, most});
  for (const TextResult& r : v.answer.results) {
    const size_t n = r.faithfulness ? r.faithfulness->removed.size() : 0;
    for (int64_t i = 0; i < most; ++i) {
      out.Int32(static_cast<size_t>(i) < n ? static_cast<int32_t>(r.faithfulness->removed[static_cast<size_t>(i)])
                                           : -1);
    }
  }
}
// Before the model runs no check has a row yet: the bound is 0 then (request_checks.cc counts the
// check's bytes of an answer from the request's top_k).
int64_t FaithfulnessRemovedBytes(const AnswerView& v, const OutputRow&, int) { return v.texts * MostRemoved(v) * 4; }

}  // namespace tensors
}  // namespace qvi
