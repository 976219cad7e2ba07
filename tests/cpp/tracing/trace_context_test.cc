// W3C traceparent parsing and the --trace-rate draw (trace_context.h).
#include "server/tracing/trace_context.h"

#include <gtest/gtest.h>

#include <set>

namespace qvi {
namespace {

constexpr char kTrace[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kParent[] = "00f067aa0ba902b7";

TEST(TraceParentTest, TheSpecificationsExampleParses) {
  std::optional<TraceParent> p = ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->trace_id, kTrace);
  EXPECT_EQ(p->parent_id, kParent);
  EXPECT_TRUE(p->sampled);
  p = ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->sampled);
}

TEST(TraceParentTest, ALaterVersionMayAddFieldsVersion00MayNot) {
  EXPECT_TRUE(ParseTraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").has_value());
  EXPECT_TRUE(ParseTraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").has_value());
  EXPECT_FALSE(ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").has_value());
  EXPECT_FALSE(ParseTraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x").has_value());
}

TEST(TraceParentTest, InvalidValuesAreIgnored) {
  for (const char* bad : {
           "", "00",
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff is invalid
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // all-zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // all-zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
           "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",   // 31 digits
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // wrong separator
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",  // not hex
       }) {
    EXPECT_FALSE(ParseTraceParent(bad).has_value()) << bad;
  }
}

TEST(TracerTest, RateZeroTracesNothingRateOneEverythingWithFreshIds) {
  Tracer none(0), all(1);
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(none.Draw(), "");
    const std::string id = all.Draw();
    EXPECT_TRUE(ParseTraceParent("00-" + id + "-" + kParent + "-01").has_value()) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

TEST(TracerTest, ARateBetweenTracesAboutThatShare) {
  Tracer tenth(0.1);
  int traced = 0;
  for (int i = 0; i < 20000; ++i) traced += !tenth.Draw().empty();
  // Binomial(20000, 0.1): mean 2000, standard deviation 42; 8 deviations either way.
  EXPECT_GT(traced, 1660);
  EXPECT_LT(traced, 2340);
}

}  // namespace
}  // namespace qvi
