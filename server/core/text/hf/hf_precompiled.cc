// SentencePiece's normalizers as the reference runs them (hf_precompiled.h).
#include "server/core/text/hf/hf_precompiled.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/text/hf/hf_models.h"
#include "server/core/text/hf/hf_unicode.h"
#include "server/core/text/tokenizer.h"

namespace qvi::hf {
namespace {

// A Darts-clone unit: a node's label and the offset to its children, or (a leaf's) a value.
bool HasLeaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
uint32_t Value(uint32_t u) { return u & ((1U << 31) - 1); }
uint32_t Label(uint32_t u) { return u & ((1U << 31) | 0xFF); }
size_t Offset(uint32_t u) { return static_cast<size_t>(u >> 10) << ((u & (1U << 9)) >> 6); }

// The reference's replace(): `old_count` characters become `replacement`'s; an inserted character is
// marked as the trailing ones, a removal is charged to the last character written so far (even one of an
// earlier chunk, or none at all when nothing was written yet: then the alignments after it shift).
void ReplaceChunk(size_t old_count, std::string_view replacement, std::vector<Change>* dest) {
  const std::u32string chars = Decode(replacement);
  const int64_t diff = static_cast<int64_t>(chars.size()) - static_cast<int64_t>(old_count);
  for (char32_t c : chars) dest->emplace_back(c, 0);
  if (diff > 0) {
    for (int64_t k = 0; k < diff; ++k) (*dest)[dest->size() - 1 - static_cast<size_t>(k)].second = 1;
  } else if (diff < 0 && !dest->empty()) {
    dest->back().second += diff;
  }
}

void Keep(const Normalized& text, size_t begin, size_t end, Normalized* out) {
  out->chars.append(text.chars, begin, end - begin);
  out->from.insert(out->from.end(), text.from.begin() + static_cast<std::ptrdiff_t>(begin),
                   text.from.begin() + static_cast<std::ptrdiff_t>(end));
  out->to.insert(out->to.end(), text.to.begin() + static_cast<std::ptrdiff_t>(begin),
                 text.to.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

void Transform(const std::vector<Change>& dest, size_t initial, Normalized* text) {
  const size_t size = text->chars.size();
  Normalized out;
  out.chars.reserve(dest.size());
  out.from.reserve(dest.size());
  out.to.reserve(dest.size());
  size_t k = std::min(initial, size);  // the next original character to consume
  for (const auto& [c, change] : dest) {
    uint32_t from = 0, to = 0;
    if (change > 0) {
      if (k >= 1) from = text->from[k - 1], to = text->to[k - 1];
    } else {
      if (k < size) from = text->from[k], to = text->to[k];
      k = std::min(size, k + 1 + static_cast<size_t>(-change));
    }
    out.chars.push_back(c);
    out.from.push_back(from);
    out.to.push_back(to);
  }
  *text = std::move(out);
}

absl::StatusOr<std::shared_ptr<const Charsmap>> Charsmap::Parse(std::string_view bytes, const std::string& path) {
  if (bytes.size() < 4) return Bad(path, "must hold the trie's size and the trie");
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i)
    trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (trie_bytes < 4 || trie_bytes % 4 != 0 || trie_bytes > bytes.size() - 4) {
    return Bad(path,
               absl::StrCat("the trie's size (", trie_bytes, " bytes) must be a positive multiple of 4 within the ",
                            bytes.size() - 4, " bytes that follow it"));
  }
  auto map = std::make_shared<Charsmap>();
  map->units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < map->units_.size(); ++i) {
    uint32_t u = 0;
    for (int b = 3; b >= 0; --b) u = (u << 8) | static_cast<unsigned char>(bytes[4 + i * 4 + static_cast<size_t>(b)]);
    map->units_[i] = u;
  }
  map->replacements_ = std::string(bytes.substr(4 + trie_bytes));
  if (absl::Status utf8 = ValidateUtf8(map->replacements_); !utf8.ok()) {
    return Bad(path, absl::StrCat("its replacements are not UTF-8: ", utf8.message()));
  }
  if (absl::Status s = map->Check(path); !s.ok()) return s;
  return std::shared_ptr<const Charsmap>(std::move(map));
}

absl::Status Charsmap::Check(const std::string& path) const {
  // Every node reachable from the root, each once: children inside the array, each leaf's value the start of
  // a replacement (or the blob's end: the empty one).
  const size_t size = units_.size();
  std::vector<bool> seen(size, false);
  std::vector<size_t> nodes;
  if (Offset(units_[0]) >= size) return Bad(path, "the trie's root points outside it");
  nodes.push_back(Offset(units_[0]));
  while (!nodes.empty()) {
    const size_t node = nodes.back();
    nodes.pop_back();
    if (seen[node]) continue;
    seen[node] = true;
    for (size_t c = 1; c < 256; ++c) {
      const size_t child = node ^ c;
      if (child >= size || Label(units_[child]) != c) continue;
      const size_t next = child ^ Offset(units_[child]);
      if (next >= size) return Bad(path, absl::StrCat("the trie's unit ", child, " points outside it"));
      if (HasLeaf(units_[child])) {
        const size_t at = Value(units_[next]);
        if (at > replacements_.size() ||
            (at < replacements_.size() && (static_cast<unsigned char>(replacements_[at]) & 0xC0) == 0x80)) {
          return Bad(path, absl::StrCat("the trie's value ", at, " is not the start of a replacement"));
        }
      }
      nodes.push_back(next);
    }
  }
  return absl::OkStatus();
}

std::optional<std::string_view> Charsmap::Lookup(std::string_view chunk) const {
  size_t node = Offset(units_[0]);
  for (char byte : chunk) {
    const auto c = static_cast<unsigned char>(byte);
    if (c == 0) break;
    node ^= c;
    if (node >= units_.size() || Label(units_[node]) != c) return std::nullopt;
    const bool leaf = HasLeaf(units_[node]);
    node ^= Offset(units_[node]);
    if (node >= units_.size()) return std::nullopt;  // Check() found none such
    if (leaf) {
      const size_t at = Value(units_[node]);
      const size_t nul = replacements_.find('\0', at);
      return std::string_view(replacements_).substr(at, (nul == std::string::npos ? replacements_.size() : nul) - at);
    }
  }
  return std::nullopt;
}

void Charsmap::Apply(Normalized* text) const {
  const std::u32string& chars = text->chars;
  std::vector<Change> dest;
  dest.reserve(chars.size());
  bool modified = false;
  std::string chunk;
  utf8proc_int32_t state = 0;
  for (size_t begin = 0; begin < chars.size();) {
    size_t end = begin + 1;  // the extended grapheme cluster [begin, end)
    while (end < chars.size() && !utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(chars[end - 1]),
                                                                   static_cast<utf8proc_int32_t>(chars[end]), &state)) {
      ++end;
    }
    chunk = Utf8(chars, begin, end);
    std::optional<std::string_view> whole = chunk.size() < 6 ? Lookup(chunk) : std::nullopt;
    if (whole) {
      modified = true;
      ReplaceChunk(end - begin, *whole, &dest);
    } else {
      for (size_t i = begin; i < end; ++i) {
        chunk.clear();
        AppendUtf8(chars[i], &chunk);
        if (std::optional<std::string_view> r = Lookup(chunk)) {
          modified = true;
          ReplaceChunk(1, *r, &dest);
        } else {
          dest.emplace_back(chars[i], 0);
        }
      }
    }
    begin = end;
  }
  if (modified) Transform(dest, 0, text);
}

void Strip(bool left, bool right, Normalized* text) {
  // The reference's lrstrip: the characters kept keep their alignments.
  size_t begin = 0, end = text->chars.size();
  if (left) {
    while (begin < end && IsWhitespace(text->chars[begin])) ++begin;
  }
  if (right) {
    while (end > begin && IsWhitespace(text->chars[end - 1])) --end;
  }
  if (begin == 0 && end == text->chars.size()) return;
  Normalized out;
  Keep(*text, begin, end, &out);
  *text = std::move(out);
}

absl::StatusOr<ReplaceRule> ParseReplace(const std::string& string_pattern, const std::string& regex_pattern,
                                         const std::string& content, const std::string& path) {
  for (const std::string* s : {&string_pattern, &regex_pattern, &content}) {
    if (absl::Status utf8 = ValidateUtf8(*s); !utf8.ok()) return Bad(path, utf8.message());
  }
  ReplaceRule rule;
  rule.content = Decode(content);
  if (regex_pattern.empty()) {
    if (string_pattern.empty()) return Bad(path + ".pattern", "must be a non-empty String or Regex");
    rule.literal = Decode(string_pattern);
    return rule;
  }
  // One character, repeated: c+ or c{n,}.
  const std::u32string re = Decode(regex_pattern);
  static constexpr std::u32string_view kMeta = U"\\.^$|?*+()[]{}";
  size_t repeats = 0;
  if (re.size() >= 2 && kMeta.find(re[0]) == std::u32string_view::npos) {
    const std::string rest = Utf8(re, 1, re.size());
    if (rest == "+") {
      repeats = 1;
    } else if (size_t n = 0; rest.size() >= 4 && rest.front() == '{' && rest.substr(rest.size() - 2) == ",}" &&
                             absl::SimpleAtoi(rest.substr(1, rest.size() - 3), &n) && n >= 1 && n <= 1'000'000) {
      repeats = n;
    }
  }
  if (repeats == 0) {
    return NotImplemented(path + ".pattern.Regex", regex_pattern.substr(0, 64),
                          "a String, or a Regex of one character repeated (' {2,}', ' +')");
  }
  rule.literal = re.substr(0, 1);
  rule.min_repeats = repeats;
  return rule;
}

void Replace(const ReplaceRule& rule, Normalized* text) {
  const std::u32string& chars = text->chars;
  auto match_at = [&](size_t i) -> size_t {
    if (rule.min_repeats == 0) {
      return chars.compare(i, rule.literal.size(), rule.literal) == 0 ? rule.literal.size() : 0;
    }
    size_t run = 0;
    while (i + run < chars.size() && chars[i + run] == rule.literal[0]) ++run;
    return run >= rule.min_repeats ? run : 0;
  };
  Normalized out;
  size_t last = 0;
  for (size_t i = 0; i < chars.size();) {
    const size_t n = match_at(i);
    if (n == 0) {
      ++i;
      continue;
    }
    Keep(*text, last, i, &out);
    for (char32_t c : rule.content) {  // inserted after the match's characters: aligned to its last one
      out.chars.push_back(c);
      out.from.push_back(text->from[i + n - 1]);
      out.to.push_back(text->to[i + n - 1]);
    }
    i += n;
    last = i;
  }
  if (last == 0) return;
  Keep(*text, last, chars.size(), &out);
  *text = std::move(out);
}

}  // namespace qvi::hf
