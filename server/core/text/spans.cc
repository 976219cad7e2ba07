#include "server/core/text/spans.h"

namespace qvi {
namespace {

struct Parsed {
  std::string prefix;  // B I E S O
  std::string type;
};

Parsed Split(const std::string& tag) {
  if (tag.empty() || tag == "O") return {"O", ""};
  const size_t dash = tag.find('-');
  if (dash == std::string::npos) return {tag, ""};
  return {tag.substr(0, dash), tag.substr(dash + 1)};
}

bool EndOfChunk(const Parsed& prev, const Parsed& cur) {
  if (prev.prefix == "E" || prev.prefix == "S") return true;
  if ((prev.prefix == "B" || prev.prefix == "I") && (cur.prefix == "B" || cur.prefix == "S" || cur.prefix == "O"))
    return true;
  return prev.prefix != "O" && prev.type != cur.type;
}

bool StartOfChunk(const Parsed& prev, const Parsed& cur) {
  if (cur.prefix == "B" || cur.prefix == "S") return true;
  if ((prev.prefix == "E" || prev.prefix == "S" || prev.prefix == "O") && (cur.prefix == "I" || cur.prefix == "E"))
    return true;
  return cur.prefix != "O" && prev.type != cur.type;
}

}  // namespace

std::vector<TagSpan> DecodeSpans(const std::vector<std::string>& tags) {
  std::vector<TagSpan> out;
  Parsed prev{"O", ""};
  int start = -1;
  const int n = static_cast<int>(tags.size());
  for (int i = 0; i <= n; ++i) {
    const Parsed cur = i < n ? Split(tags[i]) : Parsed{"O", ""};
    if (start >= 0 && EndOfChunk(prev, cur)) {
      out.push_back({start, i, prev.type});
      start = -1;
    }
    if (cur.prefix != "O" && StartOfChunk(prev, cur)) start = i;
    prev = cur;
  }
  return out;
}

}  // namespace qvi
