#include "tests/cpp/test_util/store.h"

#include <unistd.h>

#include <fstream>
#include <stdexcept>

namespace qvi::testing {

namespace fs = std::filesystem;

fs::path DemoStore() { return fs::path(QVI_SOURCE_DIR) / "model_store" / "store"; }

TempStore::TempStore(const std::string& name)
    : path_(fs::temp_directory_path() / ("qvi_" + name + "_" + std::to_string(getpid()))) {
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempStore::~TempStore() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void TempStore::CopyDemo() {
  if (!fs::exists(DemoStore() / "sentiment" / "1" / "model.pt")) {
    throw std::runtime_error("the demo store is missing: run scripts/setup.sh first");
  }
  for (const char* model : kGloveDemoModels) {
    fs::copy(DemoStore() / model, path_ / model, fs::copy_options::recursive);
  }
}

void TempStore::CopyDemoFile(const std::string& from, const std::string& to) {
  if (!fs::exists(DemoStore() / from))
    throw std::runtime_error((DemoStore() / from).string() + " is missing: run scripts/setup.sh first");
  fs::create_directories((path_ / to).parent_path());
  fs::copy_file(DemoStore() / from, path_ / to, fs::copy_options::overwrite_existing);
}

void TempStore::Write(const std::string& file, const std::string& contents) {
  fs::create_directories((path_ / file).parent_path());
  std::ofstream(path_ / file) << contents;
}

}  // namespace qvi::testing
