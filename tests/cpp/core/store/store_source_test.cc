// StoreSource::Scan on a temporary folder: which folders are models and versions, serving.json read
// with the scan, and stamps that change exactly when a version's files or serving.json change.
#include "server/core/store/store_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace qvi {
namespace {

namespace fs = std::filesystem;

class StoreSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "qvi_store_source_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  StoreSource Source() const { return StoreSource(root_.string(), {"model.pt", "model.cpu.pt2"}); }

  fs::path root_;
};

TEST_F(StoreSourceTest, OnlyCanonicalVersionFoldersCount) {
  for (const char* v : {"3", "10", "03", "3.tmp", ".3", "0", "-1", "x"}) fs::create_directories(root_ / "m" / v);
  Write("m/7", "a file, not a folder");
  fs::create_directories(root_ / "empty" / "not-a-version");
  fs::create_directories(root_ / ".hidden" / "1");
  const std::map<std::string, StoreModel> found = Source().Scan();
  ASSERT_EQ(found.size(), 1u) << "only 'm' has a version";
  EXPECT_EQ(found.at("m").versions, (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(found.at("m").dir, (root_ / "m").string());
  EXPECT_EQ(found.at("m").stamps.size(), 2u);
}

TEST_F(StoreSourceTest, ServingJsonIsReadWithTheScan) {
  fs::create_directories(root_ / "a" / "1");
  fs::create_directories(root_ / "b" / "1");
  fs::create_directories(root_ / "c" / "1");
  Write("b/serving.json", R"({"max_batch_size": 8, "version_policy": "all"})");
  Write("c/serving.json", R"({"max_batch_sise": 8})");
  const std::map<std::string, StoreModel> found = Source().Scan();
  ASSERT_TRUE(found.at("a").overrides.ok());
  EXPECT_FALSE(found.at("a").overrides->max_batch_size.has_value());
  ASSERT_TRUE(found.at("b").overrides.ok());
  EXPECT_EQ(found.at("b").overrides->max_batch_size, 8);
  ASSERT_TRUE(found.at("b").overrides->version_policy.has_value());
  EXPECT_EQ(found.at("b").overrides->version_policy->kind, VersionPolicy::Kind::kAll);
  ASSERT_FALSE(found.at("c").overrides.ok());
  EXPECT_NE(found.at("c").overrides.status().message().find("max_batch_sise"), std::string::npos)
      << found.at("c").overrides.status();
}

TEST_F(StoreSourceTest, AStampChangesWithItsVersionsFilesAndServingJsonOnly) {
  Write("m/1/model.pt", "one");
  Write("m/2/model.pt", "two");
  Write("m/2/notes.txt", "not a model file");
  const StoreModel before = Source().Scan().at("m");
  EXPECT_EQ(Source().Scan().at("m").stamps, before.stamps) << "nothing changed";

  Write("m/2/notes.txt", "still not a model file, longer");
  EXPECT_EQ(Source().Scan().at("m").stamps, before.stamps) << "a file that is not a model file";

  // Replaced by rename (a new inode) with the same size: version 2 changes, version 1 does not.
  Write("m/2/model.pt.new", "TWO");
  fs::rename(root_ / "m/2/model.pt.new", root_ / "m/2/model.pt");
  const StoreModel replaced = Source().Scan().at("m");
  EXPECT_EQ(replaced.stamps.at(1), before.stamps.at(1));
  EXPECT_NE(replaced.stamps.at(2), before.stamps.at(2));

  Write("m/1/model.cpu.pt2", "a compiled package appears");
  EXPECT_NE(Source().Scan().at("m").stamps.at(1), replaced.stamps.at(1));

  const StoreModel without = Source().Scan().at("m");
  Write("m/serving.json", "{}");
  const StoreModel with = Source().Scan().at("m");
  for (int64_t v : {1, 2}) {
    EXPECT_EQ(with.stamps.at(v).model_files, without.stamps.at(v).model_files);
    EXPECT_NE(with.stamps.at(v).serving_json, without.stamps.at(v).serving_json);
  }
}

TEST_F(StoreSourceTest, VersionDirJoinsRootNameAndVersion) {
  EXPECT_EQ(Source().VersionDir("sentiment", 12), (root_ / "sentiment" / "12").string());
}

}  // namespace
}  // namespace qvi
