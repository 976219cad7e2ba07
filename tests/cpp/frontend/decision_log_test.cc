// The decision log's redaction and destinations (server/frontend/decision_log.h): a log with a sink and a
// redactor — the texts written masked, or null with the reason when the redaction failed, never as they were;
// each line handed to the sink as it was written to the file; a sink alone, without a file.
#include "server/frontend/decision_log.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "nlohmann/json.hpp"

namespace qvi {
namespace {

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(DecisionLogTest, WritesTheRedactedTextsOrNoneAndHandsEachLineToTheSink) {
  const std::string path = (std::filesystem::path(testing::TempDir()) / "decisions-redacted.jsonl").string();
  std::filesystem::remove(path);
  DecisionLog::Options o;
  o.path = path;
  o.texts = true;
  auto log = DecisionLog::Open(o);
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<std::string> sunk;
  (*log)->SetSink([&sunk](const DecisionLog::Written& w) { sunk.push_back(w.line); });
  (*log)->SetRedactor("tagger", [](std::vector<std::string> texts, RedactDone done) {
    if (texts[0] == "fail") return done(absl::UnavailableError("the tagger is not loaded"));
    done(std::vector<RedactedText>{{"[PER] said so", {{0, 3, "PER"}}}});
  });
  InferenceResponse answer;
  answer.model = "sentiment";
  answer.version = 1;
  answer.results.resize(1);
  answer.results[0].labels = {{"positive", 0.9f}};
  // Its top words by α: "Ann" (bytes 0-3, inside the entity) and "so" (9-11).
  for (auto [word, start, alpha] : {std::tuple{"Ann", 0u, 0.7f}, std::tuple{"so", 9u, 0.3f}}) {
    TokenOutput& t = answer.results[0].tokens.emplace_back();
    t.token.text = word;
    t.token.byte_start = start;
    t.token.byte_end = start + static_cast<uint32_t>(std::string(word).size());
    t.attention = alpha;
  }
  for (const std::string text : {"Ann said so", "fail"}) {
    DecisionLog::Call call;
    call.answer = &answer;
    call.text_sha256 = {"digest"};
    call.texts = {text};
    call.request_id = text;
    (*log)->Offer(call);
  }
  (*log)->Flush();
  const std::vector<nlohmann::json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["texts"][0]["text"], "[PER] said so");
  EXPECT_EQ(lines[0]["texts"][0]["top_words"][0]["word"], "[PER]") << lines[0];  // the entity's word, masked
  EXPECT_EQ(lines[0]["texts"][0]["top_words"][1]["word"], "so");
  EXPECT_EQ(lines[0]["redacted_with"], "tagger");
  EXPECT_TRUE(lines[1]["texts"][0]["text"].is_null());
  EXPECT_TRUE(lines[1]["texts"][0]["top_words"].empty()) << "no redaction, no words of the text";
  EXPECT_EQ(lines[1]["redaction_error"], "the tagger is not loaded");
  EXPECT_EQ((*log)->redaction_failures(), 1);
  ASSERT_EQ(sunk.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(sunk[0]), lines[0]);
  EXPECT_EQ((*log)->lines(), 2);
}

TEST(DecisionLogTest, ASinkAloneNeedsNoFile) {
  DecisionLog::Options o;  // no path
  auto log = DecisionLog::Open(o);
  ASSERT_TRUE(log.ok()) << log.status();
  int sunk = 0;
  (*log)->SetSink([&sunk](const DecisionLog::Written& w) { sunk += w.model == "m" ? 1 : 0; });
  InferenceResponse answer;
  answer.model = "m";
  DecisionLog::Call call;
  call.answer = &answer;
  (*log)->Offer(call);
  (*log)->Flush();
  EXPECT_EQ(sunk, 1);
}

}  // namespace
}  // namespace qvi
