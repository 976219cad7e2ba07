// The CPU scheduling policy of the server's threads.
//
// Under Linux's default policy (SCHED_OTHER) a thread that is woken preempts the running one when it
// has run less: every answer an instance thread finishes wakes one of gRPC's callback threads to send
// it, and on a busy core that thread runs at once, sends one answer and sleeps again -- a context
// switch and a wake-up per answer instead of per batch. Under SCHED_BATCH a woken thread never
// preempts; it waits for the running thread to block or use up its slice, so the answers of a batch
// go out together and the requests read meanwhile are batched together. Nothing waits longer on an
// idle core (a woken thread goes to an idle CPU at once), and the policy has no priority: a batch
// thread gets the same share of the CPU as any other. docs/performance.md has the measurements.
#ifndef QVI_SERVER_CORE_SCHED_CPU_POLICY_H_
#define QVI_SERVER_CORE_SCHED_CPU_POLICY_H_

#include "absl/status/status.h"

namespace qvi {

// Puts every thread the process has now under SCHED_BATCH; the threads they start later inherit it.
// Needs no privilege (it lowers nothing). Errors name the thread and errno; threads that ended while
// being visited are skipped.
absl::Status UseBatchScheduling();

// Puts the calling thread (and the threads it starts) back under the default policy, SCHED_OTHER.
// The HTTP server's threads call it: there each answer is its own write on its own connection, so
// there is nothing to send together, and a woken HTTP thread that waits for the running one cost a
// lone HTTP request 25 us (docs/performance.md).
absl::Status UseDefaultSchedulingHere();

}  // namespace qvi

#endif  // QVI_SERVER_CORE_SCHED_CPU_POLICY_H_
