// Which malloc the process runs on (glibc's, or jemalloc or tcmalloc linked in or preloaded), what it
// holds, and handing its free memory back to the system. The server links jemalloc by default
// (CMake option QVI_JEMALLOC; docs/serving.md "Soak" has the measurements), but an operator may
// preload another allocator, and sanitizer builds run on the sanitizer's: each is found at run time
// by the functions it exports, so the metrics never report one allocator's figures for another's.
#ifndef QVI_SERVER_CORE_ALLOC_ALLOCATOR_H_
#define QVI_SERVER_CORE_ALLOC_ALLOCATOR_H_

namespace qvi {

struct AllocatorStats {
  const char* allocator = "glibc";  // "glibc", "jemalloc", "tcmalloc" or "sanitizer" (ASan, TSan builds)
  double in_use_bytes = 0;          // handed out to the program and not yet freed
  double free_bytes = 0;            // held by the allocator for reuse (per allocator: ReadAllocatorStats)
};

// Reads the current figures. Takes the allocator's locks (glibc: every arena's in turn), so it is
// meant for a metrics scrape, not for a hot path.
AllocatorStats ReadAllocatorStats();

// Asks the allocator to return the free memory it holds to the system (glibc: malloc_trim; jemalloc:
// purge every arena; tcmalloc: ReleaseFreeMemory). Called after a model version is freed.
void ReleaseFreeMemory();

}  // namespace qvi

#endif  // QVI_SERVER_CORE_ALLOC_ALLOCATOR_H_
