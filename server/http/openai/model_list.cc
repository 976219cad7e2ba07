#include "server/http/openai/model_list.h"

#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "server/core/manifest/manifest.h"

namespace qvi {

nlohmann::ordered_json OpenAiModelCards(const std::vector<ModelStatus>& models, int64_t created) {
  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  for (const ModelStatus& m : models) {
    // Newest first: the first READY version is the one a request without a version reaches (a shadow
    // candidate aside: it answers only the requests that name it).
    for (const VersionStatus& v : m.versions) {
      if (v.state != ModelState::kReady || v.model == nullptr || (m.shadow && m.shadow->version == v.version)) continue;
      const Manifest& manifest = v.model->manifest();
      data.push_back({{"id", m.name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "qvi-serve"},
                      {"root", manifest.name},
                      {"parent", nullptr},
                      {"max_model_len", manifest.tokenizer.max_tokens}});
      break;
    }
  }
  return data;
}

HttpResponse WithOpenAiModelList(HttpResponse native, const std::vector<ModelStatus>& models) {
  if (native.status != 200) return native;
  nlohmann::ordered_json body = nlohmann::ordered_json::parse(native.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return native;
  body["object"] = "list";
  body["data"] = OpenAiModelCards(models, absl::ToUnixSeconds(absl::Now()));
  native.body = body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return native;
}

}  // namespace qvi
