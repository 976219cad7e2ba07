// Temporary model stores for tests: a folder under the system's temp directory that is removed
// with the object, filled from the demo store that scripts/setup.sh builds.
#ifndef QVI_TESTS_CPP_TEST_UTIL_STORE_H_
#define QVI_TESTS_CPP_TEST_UTIL_STORE_H_

#include <filesystem>
#include <string>

namespace qvi::testing {

// The demo store of the checkout (model_store/store); QVI_SOURCE_DIR is set by the build.
std::filesystem::path DemoStore();

// The demo models the tests are written against, trained from GloVe by scripts/setup.sh. The demo store
// may hold more (scripts/run.sh adds the pretrained sentiment-minilm and ner-e5 after its first answer).
inline constexpr const char* kGloveDemoModels[] = {"ner", "sentiment", "topics"};

class TempStore {
 public:
  // An empty folder named after `name` and this process (so that parallel test processes differ).
  explicit TempStore(const std::string& name);
  ~TempStore();
  TempStore(const TempStore&) = delete;
  TempStore& operator=(const TempStore&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

  // Copies the three GloVe demo models in (ner, sentiment, topics: what the tests are written against),
  // whatever else the demo store holds (the pretrained demo models come later, with scripts/run.sh).
  void CopyDemo();
  // Copies one file of the demo store (e.g. "sentiment/1/model.pt") to `to`, relative to this store.
  void CopyDemoFile(const std::string& from, const std::string& to);
  // Writes `contents` to `file`, relative to this store, making its folders.
  void Write(const std::string& file, const std::string& contents);

 private:
  std::filesystem::path path_;
};

}  // namespace qvi::testing

#endif  // QVI_TESTS_CPP_TEST_UTIL_STORE_H_
