// A clock that moves only when a test advances it.
#ifndef QVI_TESTS_CPP_FAKE_CLOCK_H_
#define QVI_TESTS_CPP_FAKE_CLOCK_H_

#include "server/core/clock.h"
#include "server/core/sync.h"

namespace qvi {

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace qvi

#endif  // QVI_TESTS_CPP_FAKE_CLOCK_H_
