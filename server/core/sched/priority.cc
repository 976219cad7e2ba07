#include "server/core/sched/priority.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace qvi {
namespace {

constexpr char kTakes[] = "0 or \"default\", 1 or \"high\", 2 or \"normal\", 3 or \"low\"";

}  // namespace

absl::string_view PriorityName(Priority p) {
  switch (p) {
    case Priority::kDefault:
      return "default";
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kLow:
      return "low";
  }
  return "?";
}

absl::StatusOr<Priority> PriorityFromNumber(int64_t number, absl::string_view field) {
  if (number < 0 || number > kPriorityLevels) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", number, " is not a priority; it takes ", kTakes));
  }
  return static_cast<Priority>(number);
}

absl::StatusOr<Priority> ParsePriority(absl::string_view text, absl::string_view field) {
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (int level = 0; level <= kPriorityLevels; ++level) {
    if (name == PriorityName(static_cast<Priority>(level))) return static_cast<Priority>(level);
  }
  int64_t number = 0;
  if (absl::SimpleAtoi(name, &number)) return PriorityFromNumber(number, field);
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", text.substr(0, 32), "' is not a priority; it takes ", kTakes));
}

}  // namespace qvi
