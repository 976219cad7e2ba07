// The memory budget's decisions (guarantee 9 of model_repository.h), apart from the threads and the lock
// that carry them out, so that each can be tested on its own: what each servable is charged on its
// device (MemoryLedger), whether a load that needs room fits, is refused, or unloads which models first
// (PlanRoom), and which models have been idle long enough to unload (IdleModels).
// Not thread-safe: the manager consults it under its lock.
#ifndef QVI_SERVER_CORE_REPOSITORY_MEMORY_POLICY_H_
#define QVI_SERVER_CORE_REPOSITORY_MEMORY_POLICY_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace qvi {

// Each servable's footprint on its device, by its generation, from its load until it is freed.
class MemoryLedger {
 public:
  void Charge(uint64_t generation, const std::string& device, int64_t bytes);
  void Release(uint64_t generation);
  int64_t Charged(uint64_t generation) const;  // 0 when nothing was charged to it
  // Charged(generation) when it is on `device`, else 0.
  int64_t On(uint64_t generation, const std::string& device) const;
  int64_t Used(const std::string& device) const;
  // Of Used(device), the bytes of the servables not in `serving`: leaving, free once their requests are answered.
  int64_t Leaving(const std::string& device, const std::set<uint64_t>& serving) const;

 private:
  struct Entry {
    std::string device;  // c10::Device::str()
    int64_t bytes = 0;
  };
  std::map<uint64_t, Entry> charges_;
};

// A model holding memory on a device that a load may unload.
struct Evictable {
  std::string name;
  int64_t bytes = 0;
  int64_t last_used_ns = 0;  // when a request last resolved it
  bool busy = false;         // a request holds it now
};

// A load's ask for room on one device.
struct RoomAsk {
  int64_t budget = 0;      // the budget on the device
  int64_t used = 0;        // charged there now
  int64_t leaving = 0;     // of that, versions unloading already
  int64_t need = 0;        // what the load needs
  bool may_evict = false;  // the load was asked for (an admin, a request); a poll's never evicts
  bool timed_out = false;  // its time to wait for room has passed
};

struct RoomPlan {
  enum class Verdict {
    kFits,
    kMoreThanTheBudget,  // refused: it could never fit
    kPollEvictsNothing,  // refused: it may not evict and does not fit
    kTimedOut,           // refused: room did not come in time
    kEvict,              // unload `evict` (in this order), then ask again
    kWait,               // nothing to unload that would make room: wait for memory to drain, or a load to end
  };
  Verdict verdict = Verdict::kFits;
  std::vector<Evictable> evict;
};

// Idle models before busy ones, each group least recently used first; only as many as make room, and none
// when all of them together would not (then a load under way may end and become evictable).
RoomPlan PlanRoom(const RoomAsk& ask, std::vector<Evictable> candidates);

// A model the idle unloader looks at: whether it has a READY version, whether a request holds one, and
// when it was last used or loaded.
struct ModelUse {
  std::string name;
  bool ready = false;
  bool in_use = false;
  absl::Time last = absl::InfinitePast();
};

// The models unused for `after` (>0) at `now`; `next` lowered to when the next one may be.
std::vector<std::string> IdleModels(const std::vector<ModelUse>& models, absl::Duration after, absl::Time now,
                                    absl::Time* next);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_REPOSITORY_MEMORY_POLICY_H_
