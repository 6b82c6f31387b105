#include "titan/core/buffer.h"

#include <sys/mman.h>
#include <unistd.h>

namespace titan {

void zero_and_release(float* x, int64_t n) {
  if (n <= 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(x), hi = lo + static_cast<uintptr_t>(n) * 4;
  const uintptr_t a = (lo + page - 1) / page * page, z = hi / page * page;
  if (a >= z) {
    std::memset(x, 0, static_cast<size_t>(n) * 4);
    return;
  }
  std::memset(x, 0, a - lo);
  std::memset(reinterpret_cast<void*>(z), 0, hi - z);
  if (::madvise(reinterpret_cast<void*>(a), z - a, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(a), 0, z - a);  // still zero, just not given back
}

}  // namespace titan
