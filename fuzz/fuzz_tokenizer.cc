// Tokenizer and UTF-8 validation on arbitrary bytes. Invariants (those tests/data/tokenizer_vectors.json
// pins on known inputs): invalid UTF-8 is reported, never tokenised; on valid text every token's
// byte range holds exactly its text, its code-point offsets agree with its bytes, tokens are in
// order and do not overlap, and the normalised form is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/core/text/tokenizer.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

size_t CodePoints(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the tokenizer's settings; the rest is the text.
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!qvi::ValidateUtf8(text).ok()) return 0;
  qvi::TokenizerOptions options;
  options.level = (mode & 1) ? qvi::TokenLevel::kChar : qvi::TokenLevel::kWord;
  options.lowercase = (mode & 2) != 0;
  options.max_tokens = 1 + (mode >> 2);
  const auto tokens = qvi::Tokenizer(options).Tokenize(text);
  if (!tokens.ok()) return 0;
  uint32_t last_end = 0, last_byte_end = 0;
  for (const qvi::TextToken& t : *tokens) {
    Check(t.byte_start < t.byte_end && t.byte_end <= text.size());
    Check(t.start < t.end && t.end <= CodePoints(text));
    Check(t.byte_start >= last_byte_end && t.start >= last_end);
    Check(text.substr(t.byte_start, t.byte_end - t.byte_start) == t.text);
    Check(CodePoints(t.text) == t.end - t.start);
    Check(CodePoints(text.substr(0, t.byte_start)) == t.start);
    Check(qvi::ValidateUtf8(t.normalized).ok());
    last_end = t.end;
    last_byte_end = t.byte_end;
  }
  return 0;
}
