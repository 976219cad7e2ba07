// Counts every heap allocation of the process (operator new), for the programs that show that
// something allocates nothing: the scheduler's allocation test and its micro-benchmark. Include it
// in exactly one source file of a binary: it replaces the global operator new and delete.
#ifndef QVI_TESTS_CPP_TEST_UTIL_COUNT_ALLOCATIONS_H_
#define QVI_TESTS_CPP_TEST_UTIL_COUNT_ALLOCATIONS_H_

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace qvi::testing {
inline std::atomic<int64_t> g_allocations{0};
// Allocations so far.
inline int64_t Allocations() { return g_allocations.load(std::memory_order_relaxed); }
}  // namespace qvi::testing

void* operator new(std::size_t size) {
  qvi::testing::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

#endif  // QVI_TESTS_CPP_TEST_UTIL_COUNT_ALLOCATIONS_H_
