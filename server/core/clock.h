// Time as the serving core sees it: injected, so tests can use a fake clock and step it by hand.
#ifndef QVI_SERVER_CORE_CLOCK_H_
#define QVI_SERVER_CORE_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace qvi {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace qvi

#endif  // QVI_SERVER_CORE_CLOCK_H_
