#include "server/core/serving/redaction.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/manifest/manifest.h"
#include "server/core/serving/inference_service.h"

namespace qvi {

RedactedText MaskSpans(const std::string& text, std::vector<SpanOutput> spans, const std::set<std::string>& types) {
  std::sort(spans.begin(), spans.end(),
            [](const SpanOutput& a, const SpanOutput& b) { return a.byte_start < b.byte_start; });
  RedactedText out;
  size_t at = 0;  // bytes of `text` written or masked so far
  for (const SpanOutput& s : spans) {
    if (types.count(s.label) == 0 || s.byte_start < at || s.byte_start >= text.size()) continue;
    out.text.append(text, at, s.byte_start - at);
    absl::StrAppend(&out.text, "[", s.label, "]");
    at = std::min<size_t>(std::max<size_t>(s.byte_end, s.byte_start), text.size());
    out.masked.push_back({s.byte_start, static_cast<uint32_t>(at), s.label});
  }
  out.text.append(text, std::min(at, text.size()), std::string::npos);
  return out;
}

TextRedactor TaggerRedactor(InferenceService* core, std::string model, std::set<std::string> types) {
  return [core, model = std::move(model), types = std::move(types)](std::vector<std::string> texts, RedactDone done) {
    InferenceRequest r;
    r.model = model;
    r.texts = texts;
    r.priority = Priority::kLow;
    r.request_id = "redaction";
    r.internal = true;
    r.deadline = core->env().Now() + absl::Seconds(30);
    auto masked = [texts = std::move(texts), types, done](absl::StatusOr<InferenceResponse> tagged) {
      if (!tagged.ok()) return done(tagged.status());
      const std::vector<std::string>& known = tagged->manifest->entity_types;
      for (const std::string& type : types) {
        if (std::find(known.begin(), known.end(), type) == known.end()) {
          return done(
              absl::FailedPreconditionError(absl::StrCat("--redact-types: '", type, "' is not one of '", tagged->model,
                                                         "''s entity types (", absl::StrJoin(known, ", "), ")")));
        }
      }
      std::vector<RedactedText> out;
      for (size_t i = 0; i < texts.size() && i < tagged->results.size(); ++i) {
        if (tagged->results[i].truncated) {  // its tail was never read: it cannot be vouched for
          return done(absl::FailedPreconditionError(
              absl::StrCat("texts[", i, "]: longer than the redaction model '", tagged->model, "' reads")));
        }
        out.push_back(MaskSpans(texts[i], tagged->results[i].spans, types));
      }
      done(std::move(out));
    };
    auto work = std::make_shared<InferenceRequest>(std::move(r));
    const bool queued = core->TryRun([core, work, masked = std::move(masked)]() mutable {
      core->Submit(Method::kTag, std::move(*work), std::move(masked));
    });
    if (!queued) done(absl::ResourceExhaustedError("the server's request queue is full"));
  };
}

}  // namespace qvi
