#include "server/core/serving/subwords.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_pipeline.h"
#include "server/core/text/hf/hf_unicode.h"

namespace qvi {

namespace {

TokenOutput Position(const hf::SubwordToken& s, std::string_view text, int32_t word) {
  TokenOutput out;
  out.id = s.id;
  out.word = word;
  out.token.start = s.start;
  out.token.end = s.end;
  out.token.byte_start = s.byte_start;
  out.token.byte_end = s.byte_end;
  out.token.text = std::string(text.substr(s.byte_start, s.byte_end - s.byte_start));
  out.token.normalized = s.token;
  return out;
}

uint32_t Utf8Bytes(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// A word's span without the whitespace its pieces' offsets take in: a SentencePiece (Metaspace) piece spans the
// space it replaced ("▁German" spans " German"), the word does not -- as a WordPiece model's words, the corpora's
// entity spans and qvi/finetune.py's scorer have it. A word of whitespace alone keeps its span.
void TrimWhitespace(std::string_view text, TextToken& t) {
  const std::u32string chars = hf::Decode(text.substr(t.byte_start, t.byte_end - t.byte_start));
  size_t lead = 0, trail = 0;
  while (lead < chars.size() && hf::IsWhitespace(chars[lead])) ++lead;
  if (lead == chars.size()) return;
  while (hf::IsWhitespace(chars[chars.size() - 1 - trail])) ++trail;
  for (size_t i = 0; i < lead; ++i) t.byte_start += Utf8Bytes(chars[i]);
  for (size_t i = 0; i < trail; ++i) t.byte_end -= Utf8Bytes(chars[chars.size() - 1 - i]);
  t.start += static_cast<uint32_t>(lead);
  t.end -= static_cast<uint32_t>(trail);
}

}  // namespace

absl::Status TokenizeSubwords(const Model& model, std::string_view text, bool error_on_truncation, TextResult& result,
                              std::vector<int64_t>& ids) {
  const hf::HfTokenizer* tokenizer = model.subword_tokenizer();
  if (tokenizer == nullptr) return absl::InternalError("the model has no sub-word tokenizer");
  absl::StatusOr<std::vector<hf::SubwordToken>> sequence = tokenizer->Encode(text, /*add_special_tokens=*/false);
  if (!sequence.ok()) return sequence.status();
  const Manifest& m = model.manifest();
  const int specials = tokenizer->SpecialTokensAdded();
  const size_t room = static_cast<size_t>(m.tokenizer.max_tokens - specials);  // > 0: checked at load
  result.num_tokens = static_cast<uint32_t>(sequence->size() + static_cast<size_t>(specials));
  if (sequence->size() > room) {
    if (error_on_truncation) {
      return absl::InvalidArgumentError(
          absl::StrCat(result.num_tokens, " sub-words (", specials, " special tokens included) exceed model '", m.name,
                       "' max_tokens of ", m.tokenizer.max_tokens, " (options.truncation = ERROR)"));
    }
    sequence->resize(room);
    result.truncated = true;
  }
  const std::vector<hf::SubwordToken> positions = tokenizer->AddSpecialTokens(*std::move(sequence));
  result.tokens.clear();
  result.words.clear();
  result.tokens.reserve(positions.size());
  ids.clear();
  ids.reserve(positions.size());
  int32_t last = -1;  // the tokenizer's word of the answer's last word
  for (size_t p = 0; p < positions.size(); ++p) {
    const hf::SubwordToken& s = positions[p];
    ids.push_back(s.id);
    if (s.word < 0) {  // the post-processor's special tokens
      result.tokens.push_back(Position(s, text, -1));
      continue;
    }
    if (result.words.empty() || s.word != last) {
      WordPieces w;
      w.first = static_cast<uint32_t>(p);
      w.token.start = s.start;
      w.token.byte_start = s.byte_start;
      result.words.push_back(std::move(w));
      last = s.word;
    }
    WordPieces& w = result.words.back();
    w.end = static_cast<uint32_t>(p + 1);
    w.token.end = std::max(w.token.end, s.end);
    w.token.byte_end = std::max(w.token.byte_end, s.byte_end);
    result.tokens.push_back(Position(s, text, static_cast<int32_t>(result.words.size() - 1)));
  }
  for (WordPieces& w : result.words) {
    TrimWhitespace(text, w.token);
    w.token.text = std::string(text.substr(w.token.byte_start, w.token.byte_end - w.token.byte_start));
    w.token.normalized = w.token.text;
  }
  return absl::OkStatus();
}

std::vector<TokenOutput> WordTokens(const std::vector<WordPieces>& words, const std::vector<TokenOutput>& subwords) {
  std::vector<TokenOutput> out;
  out.reserve(words.size());
  for (const WordPieces& w : words) {
    TokenOutput t;
    t.token = w.token;
    t.id = w.first < subwords.size() ? subwords[w.first].id : 0;
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// The word × position matrices of a row of `positions` (the outputs' T): `sum` has 1 where a word
// holds the position, `mean` the same divided by the word's sub-words.
struct WordMatrices {
  at::Tensor sum, mean, first;
};

WordMatrices Matrices(const std::vector<WordPieces>& words, int64_t positions) {
  const auto n = static_cast<int64_t>(words.size());
  WordMatrices m{at::zeros({n, positions}, at::kFloat), at::zeros({n, positions}, at::kFloat), {}};
  std::vector<int64_t> first;
  float* sum = m.sum.data_ptr<float>();
  float* mean = m.mean.data_ptr<float>();
  for (int64_t w = 0; w < n; ++w) {
    const WordPieces& word = words[static_cast<size_t>(w)];
    if (word.end <= word.first || word.end > positions) {
      throw std::invalid_argument(
          absl::StrCat("word ", w, " reads positions [", word.first, ", ", word.end, ") of outputs with ", positions));
    }
    const float share = 1.0F / static_cast<float>(word.end - word.first);
    for (uint32_t p = word.first; p < word.end; ++p) {
      sum[w * positions + p] = 1.0F;
      mean[w * positions + p] = share;
    }
    first.push_back(word.first);
  }
  m.first = at::tensor(first, at::kLong);
  return m;
}

// How each output's token dimensions fold (subwords.h's rules).
enum class Fold { kKeep, kSum, kMean, kFirst, kMap, kPerLayerMean };

Fold FoldOf(Output output) {
  switch (output) {
    case Output::kLogits:
      return Fold::kKeep;
    case Output::kAttention:
    case Output::kSentenceAttention:
    case Output::kContribution:
    case Output::kSentenceContribution:
      return Fold::kSum;
    case Output::kGates:
    case Output::kSentenceGates:
    case Output::kLambdaQ:
    case Output::kLambdaK:
      return Fold::kMean;
    case Output::kTags:
    case Output::kEmissions:
      return Fold::kFirst;
    case Output::kLayerAttention:
      return Fold::kMap;
    default:
      return Fold::kPerLayerMean;  // layer_gates, layer_lambda_q, layer_lambda_k: [B,L,H,T]
  }
}

}  // namespace

ModelOutputs FoldToWords(const ModelOutputs& outputs, int64_t row, const std::vector<WordPieces>& words,
                         const OutputSet& keep) {
  ModelOutputs out;
  out.layer_index = outputs.layer_index;
  out.head_index = outputs.head_index;
  // The batch's outputs share its token count: the word matrices are built once for them all.
  std::optional<WordMatrices> built;
  auto matrices = [&](int64_t positions) -> const WordMatrices& {
    if (!built || built->sum.size(1) != positions) built = Matrices(words, positions);
    return *built;
  };
  outputs.ForEach([&](Output output, const at::Tensor& all) {
    if (!keep.test(static_cast<size_t>(output))) return;
    if (row < 0 || row >= all.size(0)) throw std::out_of_range(absl::StrCat("outputs have no row ", row));
    const Fold fold = FoldOf(output);
    if (fold == Fold::kKeep) {
      out[output] = all.narrow(0, row, 1);
      return;
    }
    if (all.dim() < 2) throw std::invalid_argument(absl::StrCat(OutputName(output), " has no token dimension"));
    const at::Tensor x = all[row];
    if (fold == Fold::kFirst) {
      out[output] = x.index_select(0, matrices(x.size(0)).first).unsqueeze(0);
      return;
    }
    const at::Tensor f = x.to(at::kFloat);
    switch (fold) {
      case Fold::kSum:
      case Fold::kMean: {
        const WordMatrices& m = matrices(f.size(0));
        out[output] = at::matmul(fold == Fold::kSum ? m.sum : m.mean, f).unsqueeze(0);  // [W] or [W,C]
        return;
      }
      case Fold::kMap: {  // [L,H,T,T]: rows (from) mean, columns (to) sum
        const WordMatrices& m = matrices(f.size(-1));
        out[output] = at::matmul(at::matmul(m.mean, f), m.sum.t()).unsqueeze(0);
        return;
      }
      default: {  // [L,H,T]
        const WordMatrices& m = matrices(f.size(-1));
        out[output] = at::matmul(f, m.mean.t()).unsqueeze(0);
        return;
      }
    }
  });
  return out;
}

std::vector<std::vector<int64_t>> WordOcclusionVariantIds(const std::vector<int64_t>& ids,
                                                          const std::vector<WordPieces>& words) {
  std::vector<std::vector<int64_t>> out;
  if (words.size() < 2) return out;
  out.reserve(words.size());
  for (const WordPieces& w : words) {
    std::vector<int64_t>& variant = out.emplace_back();
    variant.reserve(ids.size() - (w.end - w.first));
    for (size_t p = 0; p < ids.size(); ++p) {
      if (p < w.first || p >= w.end) variant.push_back(ids[p]);
    }
  }
  return out;
}

int64_t WordOcclusionVariantTokens(int64_t ids, const std::vector<WordPieces>& words) {
  if (words.size() < 2) return 0;
  int64_t tokens = 0;
  for (const WordPieces& w : words) tokens += ids - static_cast<int64_t>(w.end - w.first);
  return tokens;
}

void SpansOnSubwords(const std::vector<WordPieces>& words, std::vector<SpanOutput>& spans) {
  for (SpanOutput& s : spans) {
    if (s.token_start >= words.size() || s.token_end > words.size() || s.token_end <= s.token_start) {
      throw std::out_of_range("a span outside the text's words");
    }
    const uint32_t first = words[s.token_start].first, end = words[s.token_end - 1].end;
    s.token_start = first;
    s.token_end = end;
  }
}

}  // namespace qvi
