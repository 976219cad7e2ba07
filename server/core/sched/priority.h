// A request's priority: the order in which the batch queue serves texts when more wait than one
// batch takes (batch_scheduler.h), and which texts it sheds first when it is full.
//
// Three levels, numbered as OIP's `priority` parameter and Triton number them (1 is the highest; 0
// asks for the default): 1 high (an interactive caller), 2 normal (the default), 3 low (bulk work).
// A caller names one in its request (the native `priority` field, OIP's `priority` parameter, or the
// HTTP header X-Request-Priority); an API key may set its callers' default and the highest they may ask
// for (api_keys.h).
#ifndef QVI_SERVER_CORE_SCHED_PRIORITY_H_
#define QVI_SERVER_CORE_SCHED_PRIORITY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qvi {

// An int underneath, so that a number off the wire that is none of these (the native API's open enum)
// survives until it is refused with the number in the message (CheckRequest).
enum class Priority : int { kDefault = 0, kHigh = 1, kNormal = 2, kLow = 3 };

inline constexpr int kPriorityLevels = 3;

// Whether `p` is one of the four (a number off the wire may be none).
inline bool IsPriority(Priority p) { return static_cast<int>(p) >= 0 && static_cast<int>(p) <= kPriorityLevels; }

// 1, 2 or 3: the level a request is queued at (kDefault, and anything not a priority, counts as normal).
inline int PriorityLevel(Priority p) { return p == Priority::kDefault || !IsPriority(p) ? 2 : static_cast<int>(p); }

// "default", "high", "normal", "low".
absl::string_view PriorityName(Priority p);

// A priority by its number (0 to 3) or its name ("default", "high", "normal", "low"; any case).
// INVALID_ARGUMENT names `field`, what it got and what it takes.
absl::StatusOr<Priority> ParsePriority(absl::string_view text, absl::string_view field);
absl::StatusOr<Priority> PriorityFromNumber(int64_t number, absl::string_view field);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SCHED_PRIORITY_H_
