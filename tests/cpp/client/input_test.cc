// qvi-client's standard input: texts per line, blank lines skipped, UTF-8 checked before sending.
#include "client/input.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "client/errors.h"

namespace qvi::client {
namespace {

TEST(InvalidUtf8At, FindsTheFirstByteThatIsNotWellFormed) {
  EXPECT_EQ(InvalidUtf8At("plain ascii"), std::string_view::npos);
  EXPECT_EQ(InvalidUtf8At("東京 😀 é"), std::string_view::npos);
  EXPECT_EQ(InvalidUtf8At("ok \xff"), 3u) << "a byte that never starts a sequence";
  EXPECT_EQ(InvalidUtf8At("a\xC0\x80"), 1u) << "an overlong NUL";
  EXPECT_EQ(InvalidUtf8At("\xE0\x80\x80"), 0u) << "an overlong three-byte form";
  EXPECT_EQ(InvalidUtf8At("x\xED\xA0\x80"), 1u) << "a surrogate";
  EXPECT_EQ(InvalidUtf8At("\xF4\x90\x80\x80"), 0u) << "past U+10FFFF";
  EXPECT_EQ(InvalidUtf8At("ab\xE2\x82"), 2u) << "cut short";
  EXPECT_EQ(InvalidUtf8At("\xC3\x28"), 0u) << "a continuation byte that is not one";
  EXPECT_EQ(InvalidUtf8At("\xF4\x8F\xBF\xBF"), std::string_view::npos) << "U+10FFFF itself";
}

TEST(ReadTexts, SkipsBlankLinesAndCountsThem) {
  std::istringstream in("first\n\n   \nsecond\r\n\t\nthird");
  StdinTexts got = ReadTexts(in);
  EXPECT_EQ(got.texts, (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_EQ(got.blank_lines, 3);
  EXPECT_TRUE(got.error.empty());
}

TEST(ReadTexts, NamesTheLineThatIsNotUtf8) {
  std::istringstream in("fine\n\nbad \xC3\x28 byte\nnever read\n");
  StdinTexts got = ReadTexts(in);
  EXPECT_EQ(got.error, "line 3 of standard input is not valid UTF-8 (byte 5); the server takes UTF-8 text only");
  EXPECT_EQ(got.texts, (std::vector<std::string>{"fine"}));
}

TEST(UnknownSubcommand, NamesTheWordAndTheChoices) {
  const std::vector<std::string> subs = {"classify", "tag", "models", "health"};
  EXPECT_EQ(UnknownSubcommand({"--server", "h:1", "clasify", "x"}, subs),
            "qvi-client: 'clasify' is not a subcommand: use classify, tag, models or health (qvi-client --help)");
  EXPECT_EQ(UnknownSubcommand({"--json", "tag", "--model", "ner"}, subs), "");
  EXPECT_EQ(UnknownSubcommand({"--timeout=3", "models"}, subs), "");
  EXPECT_EQ(UnknownSubcommand({"--help"}, subs), "");
}

TEST(ErrorLines, NameTheCodeAndHintWhatToDo) {
  EXPECT_EQ(ErrorLines(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "texts: empty"), "h:1"),
            "error: INVALID_ARGUMENT: texts: empty\n");
  const std::string refused = ErrorLines(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses; last error: refused"), "h:1");
  EXPECT_NE(refused.find("hint: no server answered at h:1: start one with scripts/run.sh"), std::string::npos);
  EXPECT_EQ(ErrorLines(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model 'ner' version 3 is FAILED"), "h:1"),
            "error: UNAVAILABLE: model 'ner' version 3 is FAILED\n")
      << "a model that is not ready is not a missing server";
  EXPECT_NE(ErrorLines(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"), "h:1").find("--timeout"),
            std::string::npos);
}

}  // namespace
}  // namespace qvi::client
