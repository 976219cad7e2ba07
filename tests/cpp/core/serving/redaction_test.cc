// Redaction (server/core/serving/redaction.h): the masking of a text's entities by their byte offsets. (The tagger
// that finds them, end to end: tests/python/test_decision_log.py and test_shadow.py.)
#include "server/core/serving/redaction.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qvi {
namespace {

SpanOutput Entity(const std::string& type, uint32_t byte_start, uint32_t byte_end) {
  SpanOutput s;
  s.label = type;
  s.byte_start = byte_start;
  s.byte_end = byte_end;
  return s;
}

TEST(MaskSpansTest, MasksTheChosenTypesByTheirBytes) {
  const std::string text = "Angela Merkel met Apple in Berlin";
  // Out of order, ORG not chosen.
  const std::vector<SpanOutput> spans = {Entity("LOC", 27, 33), Entity("PER", 0, 13), Entity("ORG", 18, 23)};
  const RedactedText r = MaskSpans(text, spans, {"PER", "LOC"});
  EXPECT_EQ(r.text, "[PER] met Apple in [LOC]");
  ASSERT_EQ(r.masked.size(), 2u);  // the bytes masked, in the text as it was
  EXPECT_EQ(r.masked[0].byte_start, 0u);
  EXPECT_EQ(r.masked[0].byte_end, 13u);
  EXPECT_EQ(r.masked[1].type, "LOC");
  EXPECT_EQ(MaskSpans(text, spans, {}).text, text);
  // Overlapping spans: the first masks; a span past the text's end is nothing to mask; one running past the end
  // masks the rest.
  EXPECT_EQ(MaskSpans(text, {Entity("PER", 0, 13), Entity("PER", 7, 17), Entity("LOC", 40, 44)}, {"PER", "LOC"}).text,
            "[PER] met Apple in Berlin");
  EXPECT_EQ(MaskSpans(text, {Entity("LOC", 27, 90)}, {"LOC"}).text, "Angela Merkel met Apple in [LOC]");
  // UTF-8: bytes, not code points ("Zürich" is 7 bytes).
  EXPECT_EQ(MaskSpans("in Zürich today", {Entity("LOC", 3, 10)}, {"LOC"}).text, "in [LOC] today");
}

}  // namespace
}  // namespace qvi
