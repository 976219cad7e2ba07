// Entity spans from a tag sequence (BIO or BIOES), read the way the conlleval script reads chunks —
// the same definition the model zoo's evaluation uses (model_store/qvi/metrics.py), so the spans a
// client gets are the ones the published F1 counts. Ill-formed sequences are handled, never rejected:
// an I- after O or after another type starts a new span; B- B- makes two spans.
#ifndef QVI_SERVER_CORE_TEXT_SPANS_H_
#define QVI_SERVER_CORE_TEXT_SPANS_H_

#include <string>
#include <vector>

namespace qvi {

struct TagSpan {
  int start;  // token index, inclusive
  int end;    // token index, exclusive
  std::string type;
};

std::vector<TagSpan> DecodeSpans(const std::vector<std::string>& tags);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_TEXT_SPANS_H_
