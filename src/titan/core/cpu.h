// What this CPU reports (cpuid), its memory, this process's peak resident set, and threads.
#pragma once
#include <cstdint>
#include <string>

namespace titan::cpu {

struct Features {
  bool avx2 = false, fma = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
};
const Features& features();
std::string describe();        // e.g. "AMD EPYC ... (avx2 fma)"
int num_threads();             // OpenMP threads the kernels use
int64_t total_memory_bytes();  // MemTotal
int64_t peak_rss_bytes();      // VmHWM of this process
int64_t current_rss_bytes();   // VmRSS of this process
double now_seconds();          // monotonic clock
// Adds the seconds between its construction and its destruction to acc.
struct ScopedSeconds {
  double& acc;
  double t0 = now_seconds();
  ~ScopedSeconds() { acc += now_seconds() - t0; }
};

}  // namespace titan::cpu
