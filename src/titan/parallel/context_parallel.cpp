// Context parallelism in the trainer (context_parallel.h).
#include "titan/parallel/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "titan/core/cpu.h"

namespace titan::parallel {

void ContextParallel::all_gather(const float* in, float* out, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  std::memcpy(out + cp_.rank() * n, in, static_cast<size_t>(n) * sizeof(float));
  counts_.assign(static_cast<size_t>(cp_.size()), n);
  cp_.all_gather(out, counts_);
}

void ContextParallel::reduce_scatter(const float* in, float* out, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  counts_.assign(static_cast<size_t>(cp_.size()), n);
  cp_.reduce_scatter(in, out, counts_);
}

void ContextParallel::all_reduce_f64(double* x, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  cp_.all_reduce(x, n);
}

double context_parallel_theory_bytes(int64_t P, int64_t layers, int64_t W, int64_t B, int64_t S,
                                     int64_t microbatches, bool full_ac) {
  const double per = static_cast<double>(P - 1) / static_cast<double>(P) *
                     static_cast<double>(B * S * W) * sizeof(float);
  return per * (full_ac ? 4 : 3) * static_cast<double>(layers * microbatches);
}

void split_rows(const int32_t* full, int64_t B, int64_t S, const models::CpSlice& slice,
                int32_t* local) {
  const int64_t Sl = S / slice.size, L = Sl / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int p = 0; p < 2; ++p)
      std::copy_n(full + b * S + slice.chunk(p) * L, L, local + b * Sl + p * L);
}

}  // namespace titan::parallel
