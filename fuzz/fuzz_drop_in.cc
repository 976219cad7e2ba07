// The drop-in routes' bodies (server/http/drop_in_bodies.h), whatever their bytes: the first byte, modulo 5, picks
// the parser (TEI's predict, tokenize, decode; Hugging Face's token classification; vLLM's /classify), the rest is
// the body. Each reads it within the limits -- never more texts or lists of ids than a request may hold, no empty
// text, no text over its byte limit, no empty list of ids, every id from 0 -- or refuses it with INVALID_ARGUMENT
// and a bounded message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/http/drop_in_bodies.h"

namespace {
#define Check(ok)                                                         \
  do {                                                                    \
    if (!(ok)) {                                                          \
      std::fprintf(stderr, "check failed, line %d: %s\n", __LINE__, #ok); \
      std::abort();                                                       \
    }                                                                     \
  } while (false)
constexpr int kMaxTexts = 8;
constexpr int kMaxTextBytes = 64;

void CheckTexts(const std::vector<std::string>& texts, size_t max_bytes) {
  Check(!texts.empty() && texts.size() <= kMaxTexts);
  for (const std::string& t : texts) Check(!t.empty() && t.size() <= max_bytes);
}

template <typename T>
bool Refused(const absl::StatusOr<T>& parsed) {
  if (parsed.ok()) return false;
  Check(parsed.status().code() == absl::StatusCode::kInvalidArgument && parsed.status().message().size() < 600);
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      auto p = qvi::ParseTeiPredict(body, kMaxTexts);
      if (Refused(p)) return 0;
      CheckTexts(p->texts, body.size());
      Check(p->top_k >= 0 && (p->batch || p->texts.size() == 1));
      return 0;
    }
    case 1: {
      auto p = qvi::ParseTeiTokenize(body, kMaxTexts, kMaxTextBytes);
      if (!Refused(p)) CheckTexts(p->texts, kMaxTextBytes);
      return 0;
    }
    case 2: {
      auto p = qvi::ParseTeiDecode(body, kMaxTexts);
      if (Refused(p)) return 0;
      Check(!p->ids.empty() && p->ids.size() <= kMaxTexts);
      size_t ids = 0;
      for (const auto& list : p->ids) {
        Check(!list.empty());
        for (const int64_t id : list) Check(id >= 0);
        ids += list.size();
      }
      Check(ids <= 4 * kMaxTexts * 32 + 1024);  // ScanBody's bound on the values
      return 0;
    }
    case 3: {
      auto p = qvi::ParseTokenClassification(body, kMaxTexts);
      if (Refused(p)) return 0;
      CheckTexts(p->texts, body.size());
      Check(p->batch || p->texts.size() == 1);
      return 0;
    }
    default: {
      auto p = qvi::ParseOpenAiClassify(body, kMaxTexts);
      if (Refused(p)) return 0;
      Check(!p->texts.empty() && p->texts.size() <= kMaxTexts);
      return 0;
    }
  }
}
