// The model store as the repository's manager sees it: one Scan() lists every model folder, the
// versions in it, its serving.json (read once per scan) and a stamp of each version's files.
// Knows nothing of loading, states or policies (TF Serving's file-system source, without its
// callbacks: the manager asks for a scan each poll).
//
// Layout: <root>/<model-name>/<version>/ holding the model files, <root>/<model-name>/serving.json.
// A version folder is a canonical positive integer ("3"; not "03", "3.tmp" or ".3"), so a version
// can be staged under another name and renamed into place. Folders whose name starts with '.' and
// model folders without a version are left out.
#ifndef QVI_SERVER_CORE_STORE_STORE_SOURCE_H_
#define QVI_SERVER_CORE_STORE_STORE_SOURCE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/manifest/serving_config.h"

namespace qvi {

// What a load attempt saw of a version's files: identity, size and time of each model file and of
// the model's serving.json. A FAILED version is retried when this changes (a half-copied file heals
// once the copy completes).
struct FileStamp {
  std::string model_files, serving_json;
  bool operator==(const FileStamp& o) const { return model_files == o.model_files && serving_json == o.serving_json; }
  bool operator!=(const FileStamp& o) const { return !(*this == o); }
};

// Identity, size and time of a file ("" when absent): what tells a poll that it was written. The
// inode catches a file replaced by rename (a Secret volume's swap, `mv`) even when size and time are kept.
std::string FileIdentity(const std::string& path);

// One model folder as one scan found it.
struct StoreModel {
  std::string dir;                             // <root>/<name>
  std::vector<int64_t> versions;               // ascending
  std::map<int64_t, FileStamp> stamps;         // one per version in `versions`
  absl::StatusOr<ServingOverrides> overrides;  // serving.json: none when absent, its error when invalid
};

class StoreSource {
 public:
  // `model_files`: the names a version folder may hold (ModelFileNames()); each is in the stamp.
  StoreSource(std::string root, std::vector<std::string> model_files);

  // Every model folder with at least one version, by name.
  std::map<std::string, StoreModel> Scan() const;

  const std::string& root() const { return root_; }

  // <root>/<name>/<version>
  std::string VersionDir(const std::string& name, int64_t version) const;

 private:
  const std::string root_;
  const std::vector<std::string> model_files_;
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_STORE_STORE_SOURCE_H_
