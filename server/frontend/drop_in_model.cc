#include "server/frontend/drop_in_model.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qvi {

absl::StatusOr<std::string> ChooseModel(const std::string& named, const std::string& default_model,
                                        const ModelRepository& repository, const char* how_to_name) {
  if (!named.empty()) return named;
  if (!default_model.empty()) return default_model;
  std::vector<std::string> names;
  for (const ModelStatus& m : repository.List()) names.push_back(m.name);
  if (names.size() == 1) return names[0];
  if (names.empty()) return absl::UnavailableError("no model named, and the store holds none (yet)");
  return absl::InvalidArgumentError(
      absl::StrCat("no model named: this server holds ", names.size(), " models (",
                   absl::StrJoin(names.begin(), names.begin() + std::min<size_t>(names.size(), 8), ", "),
                   names.size() > 8 ? ", ..." : "", "); ", how_to_name, ", or start it with --default-model"));
}

}  // namespace qvi
