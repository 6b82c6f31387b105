#include "titan/core/cpu.h"

#include <omp.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace titan::cpu {
namespace {
int64_t read_kib_field(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream is(line.substr(key.size()));
      int64_t kib = 0;
      is >> kib;
      return kib * 1024;
    }
  }
  return 0;
}
}  // namespace

const Features& features() {
  static const Features f = [] {
    Features r;
    __builtin_cpu_init();
    r.avx2 = __builtin_cpu_supports("avx2");
    r.fma = __builtin_cpu_supports("fma");
    r.avx512f = __builtin_cpu_supports("avx512f");
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__builtin_cpu_supports("avx512f")) {
      __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
      r.avx512_bf16 = (a >> 5) & 1;
      __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
      r.amx_bf16 = (d >> 22) & 1;
    }
    return r;
  }();
  return f;
}

std::string describe() {
  std::string model = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  const Features& ft = features();
  std::string isa;
  if (ft.avx2) isa += " avx2";
  if (ft.fma) isa += " fma";
  if (ft.avx512f) isa += " avx512f";
  if (ft.avx512_bf16) isa += " avx512_bf16";
  if (ft.amx_bf16) isa += " amx_bf16";
  return model + " (" + (isa.empty() ? std::string("baseline") : isa.substr(1)) + ")";
}

int num_threads() { return omp_get_max_threads(); }
int64_t total_memory_bytes() { return read_kib_field("/proc/meminfo", "MemTotal:"); }
int64_t peak_rss_bytes() { return read_kib_field("/proc/self/status", "VmHWM:"); }
int64_t current_rss_bytes() { return read_kib_field("/proc/self/status", "VmRSS:"); }
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace titan::cpu
