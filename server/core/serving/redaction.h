// Redaction of the texts the server keeps (docs/observability.md, "The decision log": --redact-texts-with): a
// tagger of the store (the demo `ner`) finds each text's entities, and those of the chosen types are masked
// ("[PER] flew to [LOC]") before the text is written to the decision log or kept in a shadow summary. A text that
// cannot be masked whole (the tagger failed, or read only part of it) is not given back at all.
#ifndef QVI_SERVER_CORE_SERVING_REDACTION_H_
#define QVI_SERVER_CORE_SERVING_REDACTION_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/outputs/answer.h"

namespace qvi {

class InferenceService;

// One text, masked: its text with "[TYPE]" for each entity masked, and the masked entities' byte ranges in the
// text as it was (so that a word of it quoted elsewhere, a decision's top word, is masked alike).
struct RedactedText {
  std::string text;
  struct Masked {
    uint32_t byte_start = 0, byte_end = 0;
    std::string type;
  };
  std::vector<Masked> masked;
};

// Masks texts: `done` gets one text per text, or why they could not all be masked. May call `done` on any thread,
// before it returns or after.
using RedactDone = std::function<void(absl::StatusOr<std::vector<RedactedText>>)>;
using TextRedactor = std::function<void(std::vector<std::string> texts, RedactDone done)>;

// `text` with each span of `types` among `spans` (byte offsets into it) replaced by "[TYPE]"; a span that
// overlaps one masked before it is left to that one; a span that runs past the text's end masks the rest.
RedactedText MaskSpans(const std::string& text, std::vector<SpanOutput> spans, const std::set<std::string>& types);

// A redactor that runs the texts through the tagger `model` of `core`, at the lowest priority and from a request
// thread (never the caller's), as the server's own request (InferenceRequest::internal: no caller's traffic), and
// masks their entities of `types`. A type the tagger does not have fails the redaction (a typo must not mask
// nothing while the log says it masked).
TextRedactor TaggerRedactor(InferenceService* core, std::string model, std::set<std::string> types);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SERVING_REDACTION_H_
