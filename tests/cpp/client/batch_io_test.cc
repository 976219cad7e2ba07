// qvi-client batch's files: the texts of JSONL, CSV and plain text with their ids, the ids an earlier
// run answered (its cut-short last line removed), the progress line.
#include "client/batch_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace qvi::client {
namespace {

std::vector<BatchText> Read(const std::string& data, const std::string& format) {
  std::istringstream in(data);
  return ReadBatchTexts(in, format, "text", "id");
}

TEST(BatchIo, JsonlTextsKeepTheirIdsOrAreKnownByTheirPosition) {
  std::vector<BatchText> t = Read(
      "{\"id\": \"a\", \"text\": \"first\"}\n\n{\"text\": \"second\"}\n{\"id\": 7, "
      "\"text\": \"third\", \"other\": 1}\n",
      "jsonl");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].id, "a");
  EXPECT_EQ(t[1].id, 2) << "no id: its position among the texts";
  EXPECT_EQ(t[2].id, 7);
  EXPECT_EQ(t[2].text, "third");
  EXPECT_THROW(Read("{\"id\": 1}\n", "jsonl"), std::invalid_argument);
  EXPECT_THROW(Read("not json\n", "jsonl"), std::invalid_argument);
  try {
    Read("{\"id\": 1, \"text\": \"x\"}\n{\"id\": 1, \"text\": \"y\"}\n", "jsonl");
    FAIL() << "a repeated id was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("given twice"), std::string::npos) << e.what();
  }
}

TEST(BatchIo, CsvFieldsMayHoldCommasQuotesAndLineBreaks) {
  std::vector<BatchText> t =
      Read("id,text\r\n1,plain\r\n2,\"with, a comma\"\r\n3,\"a \"\"quote\"\"\nand a line\"\r\n\r\n", "csv");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].id, "1");
  EXPECT_EQ(t[0].text, "plain");
  EXPECT_EQ(t[1].text, "with, a comma");
  EXPECT_EQ(t[2].text, "a \"quote\"\nand a line");
  EXPECT_THROW(Read("id,text\n1,\"open\n", "csv"), std::invalid_argument);
  EXPECT_THROW(Read("id,body\n1,x\n", "csv"), std::invalid_argument) << "no text column";
  std::vector<BatchText> no_ids = Read("text\nx\ny\n", "csv");
  EXPECT_EQ(no_ids[1].id, 2);
}

TEST(BatchIo, PlainTextIsOneTextPerLineBlankOnesIncluded) {
  std::vector<BatchText> t = Read("one\r\n\nthree\n", "text");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].text, "one");
  EXPECT_EQ(t[1].text, "") << "the server answers it (INVALID_ARGUMENT for a classifier): nothing is dropped";
  EXPECT_EQ(t[2].id, 3);
  EXPECT_EQ(FormatOf("x/y.JSONL"), "jsonl");
  EXPECT_EQ(FormatOf("a.csv"), "csv");
  EXPECT_EQ(FormatOf("a.txt"), "text");
}

TEST(BatchIo, AnsweredIdsAreTheResultsOfTheOutputAndACutLineIsRemoved) {
  const std::string path = (std::filesystem::temp_directory_path() / "qvi_batch_io_test.jsonl").string();
  {
    std::ofstream out(path, std::ios::trunc);
    out << "{\"id\": \"a\", \"result\": {}}\n{\"id\": 2, \"error\": {\"code\": \"UNAVAILABLE\"}}\n"
           "{\"id\": 3, \"result\": {}}\n{\"id\": \"cut\", \"res";
  }
  std::set<std::string> done = AnsweredIds(path);
  EXPECT_EQ(done, (std::set<std::string>{"\"a\"", "3"})) << "errors are asked again";
  std::ifstream in(path);
  std::stringstream rest;
  rest << in.rdbuf();
  EXPECT_EQ(rest.str().back(), '\n');
  EXPECT_EQ(rest.str().find("cut"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_TRUE(AnsweredIds(path).empty()) << "no output yet";
}

TEST(BatchIo, TheProgressLineShowsCountRateAndWhatIsLeft) {
  EXPECT_EQ(ProgressLine::Format("classify sentiment", 250, 1000, 2.5),
            "classify sentiment  250/1000 texts  [======>                 ]  25%  100.0 texts/s  ETA 0:08");
  EXPECT_EQ(ProgressLine::Format("tag ner", 0, 10, 0),
            "tag ner  0/10 texts  [>                       ]   0%  0.0 "
            "texts/s  ETA ?");
}

}  // namespace
}  // namespace qvi::client
