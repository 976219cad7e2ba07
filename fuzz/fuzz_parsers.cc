// The artifact and configuration parsers on arbitrary bytes: the manifest (manifest.json inside
// model.pt), the vocabulary (vocab.txt), serving.json, and the version policy string. Each input
// must be accepted or refused with a message, under ASan and UBSan.
// One binary, the parser picked by QVI_FUZZ_PARSER at build time.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/core/manifest/manifest.h"
#include "server/core/manifest/serving_config.h"
#include "server/core/text/vocabulary.h"

namespace {
void Check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
#if QVI_FUZZ_PARSER == 1
  auto m = qvi::Manifest::Parse(input);
  if (!m.ok()) Check(!m.status().message().empty());
#elif QVI_FUZZ_PARSER == 2
  auto v = qvi::Vocabulary::Parse(input);
  if (v.ok()) {
    // It starts with [PAD] and [UNK], as Parse promises.
    Check(v->size() >= 2 && v->Id("[PAD]") == qvi::Vocabulary::kPadId);
  } else {
    Check(!v.status().message().empty());
  }
#elif QVI_FUZZ_PARSER == 3
  auto o = qvi::ServingOverrides::Parse(input);
  if (o.ok()) {
    if (o->max_batch_size) Check(*o->max_batch_size >= 1);
    if (o->instances) Check(*o->instances >= 1);
  } else {
    Check(!o.status().message().empty());
  }
#elif QVI_FUZZ_PARSER == 4
  auto p = qvi::VersionPolicy::Parse(input);
  if (!p.ok()) Check(!p.status().message().empty());
#else
#error "QVI_FUZZ_PARSER must be 1 to 4"
#endif
  return 0;
}
