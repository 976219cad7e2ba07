// Span decoding (BIO/BIOES, conlleval's reading) on arbitrary sequences of a manifest's tags, in
// well-formed order or not:
// every span lies inside the sequence, is not empty, spans are in order and do not overlap, and
// every token inside a span carries a tag of the span's type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/core/text/spans.h"

namespace {
void Check(bool ok) {
  if (!ok) std::abort();
}
// Tags a manifest can hold (Manifest::Parse refuses the others): O and B/I/E/S with a type.
const char* const kTags[] = {"O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-X", "I-X"};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> tags;
  for (size_t i = 0; i < size; ++i) tags.emplace_back(kTags[data[i] % (sizeof(kTags) / sizeof(kTags[0]))]);
  int last_end = 0;
  for (const qvi::TagSpan& s : qvi::DecodeSpans(tags)) {
    Check(s.start >= last_end && s.start < s.end && s.end <= static_cast<int>(tags.size()));
    Check(!s.type.empty());
    for (int i = s.start; i < s.end; ++i) Check(tags[i].size() > 2 && tags[i].substr(2) == s.type);
    last_end = s.end;
  }
  return 0;
}
