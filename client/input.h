#ifndef QVI_CLIENT_INPUT_H_
#define QVI_CLIENT_INPUT_H_

#include <istream>
#include <string>
#include <string_view>
#include <vector>

namespace qvi::client {

// The texts of standard input: one per line, blank lines (nothing but spaces) skipped and counted, a
// trailing '\r' taken off. `error` is set, naming the line, when a line is not valid UTF-8; the
// texts read so far are returned.
struct StdinTexts {
  std::vector<std::string> texts;
  int blank_lines = 0;
  std::string error;
};
StdinTexts ReadTexts(std::istream& in);

// The byte offset of the first byte that does not begin or continue a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points past U+10FFFF included), or npos when there is none.
size_t InvalidUtf8At(std::string_view s);

// qvi-client's texts: "-", as the only text, is replaced by the lines of standard input (ReadTexts), standard
// error told of blank lines skipped; then each is checked to be UTF-8. An exit code (after a message on standard
// error) when they cannot be sent, else -1.
int TextsToSend(std::vector<std::string>& texts);

}  // namespace qvi::client

#endif  // QVI_CLIENT_INPUT_H_
