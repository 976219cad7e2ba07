// ReadAllocatorStats and ReleaseFreeMemory on whichever allocator this binary runs on: built as
// allocator_test (glibc's malloc; the sanitizer's in scripts/sanitize.sh's builds) and
// allocator_jemalloc_test (linked with jemalloc, as qvi-server is); QVI_EXPECTED_ALLOCATOR says which
// one the build must find.
#include "server/core/alloc/allocator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace qvi {
namespace {

TEST(AllocatorTest, FindsTheAllocatorItRunsOn) { EXPECT_STREQ(ReadAllocatorStats().allocator, QVI_EXPECTED_ALLOCATOR); }

TEST(AllocatorTest, CountsWhatIsHeldAsInUse) {
  const double before = ReadAllocatorStats().in_use_bytes;
  // 64 MiB in 1 KiB blocks, written so that they are really allocated.
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 64 * 1024; ++i) {
    blocks.emplace_back(new char[1024]);
    std::memset(blocks.back().get(), i & 0xff, 1024);
  }
  const double held = ReadAllocatorStats().in_use_bytes;
  EXPECT_GE(held, before + 64.0 * 1024 * 1024);
  blocks.clear();
  EXPECT_LT(ReadAllocatorStats().in_use_bytes, held - 32.0 * 1024 * 1024);
}

TEST(AllocatorTest, ReleasingGivesFreeMemoryBack) {
  // 64 MiB allocated and freed: the allocator keeps the pages for reuse until it is asked to release.
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 64 * 1024; ++i) {
    blocks.emplace_back(new char[1024]);
    std::memset(blocks.back().get(), 1, 1024);
  }
  blocks.clear();
  const double free_before = ReadAllocatorStats().free_bytes;
  ReleaseFreeMemory();
  const double free_after = ReadAllocatorStats().free_bytes;
  EXPECT_GE(free_before, 0);
  EXPECT_LE(free_after, free_before);
  const std::string allocator = QVI_EXPECTED_ALLOCATOR;
  if (allocator == "jemalloc" || allocator == "tcmalloc") {
    // jemalloc and tcmalloc keep freed pages (dirty, or in the page heap) until they are purged or
    // released. glibc's figure counts free bytes whether resident or not, and a sanitizer keeps freed
    // memory in quarantine, so theirs need not drop.
    EXPECT_LT(free_after, free_before - 16.0 * 1024 * 1024) << "free before " << free_before;
  }
}

}  // namespace
}  // namespace qvi
