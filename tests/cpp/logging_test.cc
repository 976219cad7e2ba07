// The budget that keeps gRPC's and protobuf's own log lines from flooding stderr (logging.h), on
// explicit times: no clock, no sleeps.
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "qvi/serving/v1/inference.pb.h"
#include "server/logging.h"

namespace qvi {
namespace {

TEST(LineBudgetTest, ABurstThenTheRateAndTheNextLineSaysHowManyWereRefused) {
  LineBudget budget(/*burst=*/3, /*per_second=*/0.5);
  uint64_t refused = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(budget.Take(100.0, &refused)) << i;
    EXPECT_EQ(refused, 0u);
  }
  EXPECT_FALSE(budget.Take(100.0, &refused));
  EXPECT_FALSE(budget.Take(101.0, &refused)) << "half a line earned after one second";
  EXPECT_TRUE(budget.Take(102.0, &refused)) << "one line after two seconds";
  EXPECT_EQ(refused, 2u) << "the two refused since the last line written";
  EXPECT_FALSE(budget.Take(102.5, &refused));
  // A long quiet spell refills the burst, never more.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.Take(10000.0, &refused)) << i;
  EXPECT_FALSE(budget.Take(10000.0, &refused));
}

TEST(LineBudgetTest, ATimeThatStepsBackEarnsNothing) {
  LineBudget budget(1, 1);
  uint64_t refused = 0;
  EXPECT_TRUE(budget.Take(50.0, &refused));
  EXPECT_FALSE(budget.Take(10.0, &refused));
  EXPECT_FALSE(budget.Take(50.5, &refused));
  EXPECT_TRUE(budget.Take(51.0, &refused));
  EXPECT_EQ(refused, 2u);
}

// What the libraries write goes through the server's logger, one JSON object a line, and past a burst
// is counted instead of written. Clients once provoked protobuf's lines (a string field that is not
// UTF-8 sent to gRPC's reflection service); every request is now walked before protobuf sees it, so
// the lines are provoked here directly.
TEST(LibraryLogsTest, ProtobufAndGrpcLinesAreJsonLinesOfTheServerAndRateLimited) {
  ConfigureLogging("info", LogFormat::kJson);
  RouteLibraryLogs();
  grpc_init();  // gpr_log drops lines until gRPC is initialised, as the server's are
  const uint64_t suppressed_before = LibraryLinesSuppressed();
  testing::internal::CaptureStderr();
  for (int i = 0; i < 60; ++i) {
    serving::v1::ModelSpec spec;
    EXPECT_FALSE(spec.ParseFromString(std::string("\x0a\x02\xff\xfe", 4)));  // name: not UTF-8
    gpr_log(GPR_ERROR, "a gRPC error line %d", i);
  }
  spdlog::default_logger()->flush();
  const std::string out = testing::internal::GetCapturedStderr();
  grpc_shutdown();
  ShutdownLogging();
  std::istringstream lines(out);
  int protobuf = 0, grpc = 0;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);  // throws on a line that is not JSON
    const std::string msg = j.at("msg");
    if (msg.rfind("protobuf: ", 0) == 0) {
      ++protobuf;
      EXPECT_EQ(j.at("level"), "error") << line;
      EXPECT_NE(msg.find("invalid UTF-8"), std::string::npos) << line;
    }
    grpc += msg.rfind("grpc: ", 0) == 0;
  }
  // 20 at once, then 10 a minute: the test takes well under 6 s.
  EXPECT_GE(protobuf, 20);
  EXPECT_LE(protobuf, 21);
  EXPECT_GE(grpc, 20);
  EXPECT_LE(grpc, 21);
  EXPECT_GE(LibraryLinesSuppressed() - suppressed_before, 2u * (60 - 21));
}

}  // namespace
}  // namespace qvi
