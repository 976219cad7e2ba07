#include "server/core/store/store_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qvi {

namespace fs = std::filesystem;

std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

StoreSource::StoreSource(std::string root, std::vector<std::string> model_files)
    : root_(std::move(root)), model_files_(std::move(model_files)) {}

std::string StoreSource::VersionDir(const std::string& name, int64_t version) const {
  return (fs::path(root_) / name / std::to_string(version)).string();
}

std::map<std::string, StoreModel> StoreSource::Scan() const {
  std::map<std::string, StoreModel> found;
  std::error_code ec;
  for (const fs::directory_entry& folder : fs::directory_iterator(root_, ec)) {
    const std::string name = folder.path().filename().string();
    if (!folder.is_directory(ec) || name.rfind('.', 0) == 0) continue;
    StoreModel model;
    for (const fs::directory_entry& v : fs::directory_iterator(folder.path(), ec)) {
      const std::string file = v.path().filename().string();
      int64_t number = 0;
      if (v.is_directory(ec) && absl::SimpleAtoi(file, &number) && number > 0 && file == absl::StrCat(number)) {
        model.versions.push_back(number);
      }
    }
    if (model.versions.empty()) continue;
    std::sort(model.versions.begin(), model.versions.end());
    model.dir = folder.path().string();
    // The stamp of serving.json is taken before reading it: a file that changes while it is read
    // leaves a stamp that differs from the next scan's, so a failure it caused is retried.
    const std::string serving_stamp = FileIdentity(folder.path() / "serving.json");
    model.overrides = ServingOverrides::Read(model.dir);
    for (int64_t version : model.versions) {
      FileStamp& stamp = model.stamps[version];
      stamp.serving_json = serving_stamp;
      for (const std::string& file : model_files_)
        absl::StrAppend(&stamp.model_files, FileIdentity(folder.path() / std::to_string(version) / file), ";");
    }
    found.emplace(name, std::move(model));
  }
  return found;
}

}  // namespace qvi
