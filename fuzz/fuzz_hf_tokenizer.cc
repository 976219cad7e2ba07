// The sub-word tokenizer (server/core/text/hf/hf_tokenizer.h): the first byte's low bit picks what the
// rest is. 0: a tokenizer.json, which must load or be refused with INVALID_ARGUMENT, and whatever loads
// must encode a fixed text; 1: a text, encoded with a small WordPiece tokenizer (BERT's normalizer and
// pre-tokenizer, an added token, a template), whose tokens must lie inside the text, in order, with ids
// from the vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/core/text/hf/hf_tokenizer.h"

namespace {

constexpr char kTokenizer[] = R"({"added_tokens": [{"id": 4, "content": "[MASK]", "special": true}],
  "normalizer": {"type": "BertNormalizer", "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]"}},
    {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "[SEP]"}}]},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "max_input_chars_per_word": 12, "vocab": {
    "[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "a": 5, "b": 6, "##a": 7, "##b": 8, "ab": 9,
    "!": 10, "東": 11, "e": 12, "##e": 13, "##ab": 14}}})";

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto loaded = qvi::hf::HfTokenizer::FromJson(rest);
    if (!loaded.ok()) {
      Check(loaded.status().code() == absl::StatusCode::kInvalidArgument);
      return 0;
    }
    auto encoded = (*loaded)->Encode("A text, with Ünïcödé 東京 and [MASK]!");
    Check(encoded.ok());
    return 0;
  }
  static const auto* tokenizer = qvi::hf::HfTokenizer::FromJson(kTokenizer)->release();
  auto encoded = tokenizer->Encode(rest);
  if (!encoded.ok()) return 0;  // not UTF-8
  uint32_t last = 0;
  for (const qvi::hf::SubwordToken& t : *encoded) {
    Check(t.id >= 0 && t.id < tokenizer->VocabularySize());
    if (t.special && t.start == 0 && t.end == 0) continue;
    Check(t.start <= t.end && t.byte_start <= t.byte_end && t.byte_end <= rest.size() && t.start >= last);
    last = t.start;
  }
  return 0;
}
