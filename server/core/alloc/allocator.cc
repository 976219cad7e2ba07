#include "server/core/alloc/allocator.h"

#include <dlfcn.h>
#include <malloc.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace qvi {
namespace {

// jemalloc's control interface: int mallctl(name, oldp, oldlenp, newp, newlen).
using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);
// gperftools' C interface to MallocExtension.
using TcGetPropertyFn = int (*)(const char*, size_t*);
using TcReleaseFn = void (*)();
// The sanitizers' allocator (ASan, TSan): sanitizer/allocator_interface.h.
using SanitizerBytesFn = size_t (*)();

struct Allocator {
  MallctlFn mallctl = nullptr;
  TcGetPropertyFn tc_get = nullptr;
  TcReleaseFn tc_release = nullptr;
  SanitizerBytesFn san_allocated = nullptr;
  SanitizerBytesFn san_free = nullptr;
};

// Looked up once in the global scope: found when the allocator is linked into the executable or
// preloaded (LD_PRELOAD), which is also when it is the malloc everybody calls.
const Allocator& Found() {
  static const Allocator found = [] {
    Allocator a;
    a.mallctl = reinterpret_cast<MallctlFn>(dlsym(RTLD_DEFAULT, "mallctl"));
    if (a.mallctl == nullptr) {
      a.tc_get = reinterpret_cast<TcGetPropertyFn>(dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"));
      a.tc_release = reinterpret_cast<TcReleaseFn>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
    }
    if (a.mallctl == nullptr && a.tc_get == nullptr) {
      a.san_allocated =
          reinterpret_cast<SanitizerBytesFn>(dlsym(RTLD_DEFAULT, "__sanitizer_get_current_allocated_bytes"));
      a.san_free = reinterpret_cast<SanitizerBytesFn>(dlsym(RTLD_DEFAULT, "__sanitizer_get_free_bytes"));
    }
    return a;
  }();
  return found;
}

double JemallocStat(MallctlFn mallctl, const char* name) {
  size_t value = 0;
  size_t len = sizeof(value);
  return mallctl(name, &value, &len, nullptr, 0) == 0 ? static_cast<double>(value) : 0.0;
}

double TcmallocStat(TcGetPropertyFn get, const char* name) {
  size_t value = 0;
  return get(name, &value) != 0 ? static_cast<double>(value) : 0.0;
}

}  // namespace

AllocatorStats ReadAllocatorStats() {
  const Allocator& a = Found();
  AllocatorStats s;
  if (a.mallctl != nullptr) {
    // The statistics are a snapshot taken when the epoch is advanced.
    uint64_t epoch = 1;
    size_t len = sizeof(epoch);
    a.mallctl("epoch", &epoch, &len, &epoch, len);
    s.allocator = "jemalloc";
    s.in_use_bytes = JemallocStat(a.mallctl, "stats.allocated");
    // Resident pages that hold no allocation: dirty pages not yet purged, partly used pages and
    // jemalloc's own metadata; what RSS holds beyond what the program uses.
    const double resident = JemallocStat(a.mallctl, "stats.resident");
    s.free_bytes = resident > s.in_use_bytes ? resident - s.in_use_bytes : 0.0;
  } else if (a.tc_get != nullptr) {
    s.allocator = "tcmalloc";
    s.in_use_bytes = TcmallocStat(a.tc_get, "generic.current_allocated_bytes");
    // Free memory still mapped: the page heap's free pages and the central, transfer and
    // per-thread caches (pages already given back to the system are not counted).
    s.free_bytes = TcmallocStat(a.tc_get, "tcmalloc.pageheap_free_bytes") +
                   TcmallocStat(a.tc_get, "tcmalloc.central_cache_free_bytes") +
                   TcmallocStat(a.tc_get, "tcmalloc.transfer_cache_free_bytes") +
                   TcmallocStat(a.tc_get, "tcmalloc.thread_cache_free_bytes");
  } else if (a.san_allocated != nullptr && a.san_free != nullptr) {
    // A sanitizer build: its allocator replaces glibc's, whose figures would read zero.
    s.allocator = "sanitizer";
    s.in_use_bytes = static_cast<double>(a.san_allocated());
    s.free_bytes = static_cast<double>(a.san_free());
  } else {
    // glibc, summed over its arenas: in use in heaps and in chunks mapped on their own; free inside
    // its heaps (resident or not).
    const struct mallinfo2 info = mallinfo2();
    s.in_use_bytes = static_cast<double>(info.uordblks + info.hblkhd);
    s.free_bytes = static_cast<double>(info.fordblks);
  }
  return s;
}

void ReleaseFreeMemory() {
  const Allocator& a = Found();
  if (a.mallctl != nullptr) {
    // MALLCTL_ARENAS_ALL is 4096 in jemalloc 5.
    a.mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
  } else if (a.tc_release != nullptr) {
    a.tc_release();
  } else if (a.san_allocated == nullptr) {
    malloc_trim(0);
  }  // a sanitizer's allocator keeps freed memory in quarantine on purpose
}

}  // namespace qvi
