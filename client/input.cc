#include "client/input.h"

#include <iostream>
#include <string>
#include <utility>

namespace qvi::client {

size_t InvalidUtf8At(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = 0;                           // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the first continuation byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 2;
      if (b == 0xE0) lo = 0xA0;  // no overlong forms
      if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // cut short
    for (int k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += n + 1;
  }
  return std::string_view::npos;
}

StdinTexts ReadTexts(std::istream& in) {
  StdinTexts out;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      ++out.blank_lines;
      continue;
    }
    if (const size_t at = InvalidUtf8At(line); at != std::string_view::npos) {
      out.error = "line " + std::to_string(number) + " of standard input is not valid UTF-8 (byte " +
                  std::to_string(at + 1) + "); the server takes UTF-8 text only";
      return out;
    }
    out.texts.push_back(std::move(line));
  }
  return out;
}

namespace {

int ReadStandardInput(std::vector<std::string>& texts) {
  if (texts.size() != 1 || texts[0] != "-") return -1;
  StdinTexts in = ReadTexts(std::cin);
  if (!in.error.empty()) {
    std::cerr << "qvi-client: " << in.error << "\n";
    return 2;
  }
  if (in.blank_lines > 0) std::cerr << "qvi-client: skipped " << in.blank_lines << " blank line(s) of standard input\n";
  if (in.texts.empty()) {
    std::cerr << "qvi-client: standard input held no text\n";
    return 2;
  }
  texts = std::move(in.texts);
  return -1;
}

}  // namespace

int TextsToSend(std::vector<std::string>& texts) {
  if (const int rc = ReadStandardInput(texts); rc >= 0) return rc;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (const size_t at = InvalidUtf8At(texts[i]); at != std::string_view::npos) {
      std::cerr << "qvi-client: text " << i + 1 << " is not valid UTF-8 (byte " << at + 1 << ")\n";
      return 2;
    }
  }
  return -1;
}

}  // namespace qvi::client
