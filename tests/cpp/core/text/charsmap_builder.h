// Tests' and fuzzers' SentencePiece rules: a Precompiled normalizer's precompiled_charsmap built from a few rules.
#ifndef QVI_TESTS_CPP_CORE_TEXT_CHARSMAP_BUILDER_H_
#define QVI_TESTS_CPP_CORE_TEXT_CHARSMAP_BUILDER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"

namespace qvi::hf::fixtures {

// A precompiled_charsmap (base64) holding `rules` (key -> replacement): a Darts double array as sentencepiece
// compiles its normalization rules into, each node in a 256-unit block of its own.
inline std::string Charsmap(const std::vector<std::pair<std::string, std::string>>& rules) {
  std::vector<uint32_t> units(256);
  std::string replacements;
  auto block = [&] {
    units.resize(units.size() + 256);
    return static_cast<uint32_t>(units.size() - 256);
  };
  const uint32_t root = block();
  units[0] = root << 10;  // the root's children are at root ^ byte
  std::map<std::string, uint32_t> nodes;
  for (const auto& [key, replacement] : rules) {
    uint32_t node = root;
    for (size_t i = 0; i < key.size(); ++i) {
      const auto c = static_cast<unsigned char>(key[i]);
      const uint32_t slot = node ^ c;
      auto [at, added] = nodes.try_emplace(key.substr(0, i + 1), 0);
      if (added) {
        at->second = block();
        units[slot] = ((slot ^ at->second) << 10) | c;  // label c, children at slot ^ offset
      }
      node = at->second;
      if (i + 1 == key.size()) {
        units[slot] |= 1U << 8;  // a leaf: its value, the replacement's start, is the child's unit
        units[node] = static_cast<uint32_t>(replacements.size());
        replacements += replacement + '\0';
      }
    }
  }
  std::string bytes;
  for (uint32_t u : std::vector<uint32_t>{static_cast<uint32_t>(units.size() * 4)}) {
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
  for (uint32_t u : units) {
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  }
  return absl::Base64Escape(bytes + replacements);
}

}  // namespace qvi::hf::fixtures

#endif  // QVI_TESTS_CPP_CORE_TEXT_CHARSMAP_BUILDER_H_
