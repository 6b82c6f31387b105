#include "titan/core/buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

namespace titan {

namespace {
std::atomic<int64_t> g_planned{0};
}  // namespace

void note_planned_bytes(int64_t bytes) { g_planned = bytes; }
int64_t planned_bytes() { return g_planned; }

void zero_and_release(void* p, size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  const uintptr_t a = (lo + page - 1) / page * page, z = hi / page * page;
  if (a >= z) {
    std::memset(p, 0, bytes);
    return;
  }
  std::memset(p, 0, a - lo);
  std::memset(reinterpret_cast<void*>(z), 0, hi - z);
  if (::madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(a), 0, z - a);  // still zero, just not given back
}

void zero_and_release(const Storage& s, void* p, size_t bytes) {
  if (bytes == 0) return;
  if (s.reserved())
    s.memory().decommit(p, bytes);
  else if (s.memory().host())
    zero_and_release(p, bytes);
  else
    s.memory().memset(p, 0, bytes);
}

void commit(const Storage& s, void* p, size_t bytes) {
  if (bytes == 0) return;
  if (s.reserved()) {
    s.memory().commit(p, bytes);
  } else if (s.memory().host()) {  // best effort: before Linux 5.14 the writes fault them in
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
    const uintptr_t a = lo / page * page, z = (hi + page - 1) / page * page;
    ::madvise(reinterpret_cast<void*>(a), z - a, MADV_POPULATE_WRITE);
  }
}

void Storage::reserve(size_t nbytes, const DeviceMemory& mem) {
  if (mem.host() || !mem.reserve) {
    resize(nbytes, mem);
    return;
  }
  release();
  mem_ = mem;
  if (nbytes == 0) return;
  p_ = mem_.reserve((nbytes + 63) / 64 * 64);  // throws when it cannot
  nbytes_ = nbytes;
  reserved_ = true;
}

void Storage::release() {
  if (!p_) return;
  if (!mem_.host())
    mem_.free(p_);
  else if (mapped_)
    ::munmap(p_, mapped_);
  else
    std::free(p_);
  p_ = nullptr;
  nbytes_ = mapped_ = 0;
  reserved_ = false;
}

void Storage::resize(size_t nbytes) {
  release();
  if (nbytes == 0) return;
  const size_t padded = (nbytes + 63) / 64 * 64;
  if (!mem_.host()) {
    p_ = mem_.alloc(padded);  // throws std::bad_alloc
    mem_.memset(p_, 0, padded);
  } else if (padded >= kMapBytes) {
    void* p = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory(padded);
    ::madvise(p, padded, MADV_HUGEPAGE);  // fewer faults (and TLB misses); best effort
    p_ = p;
    mapped_ = padded;
  } else {
    p_ = std::aligned_alloc(64, padded);
    if (!p_) throw OutOfMemory(padded);
    std::memset(p_, 0, padded);
  }
  nbytes_ = nbytes;
}

}  // namespace titan
