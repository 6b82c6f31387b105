// AdamW's per-element maths, written once for the CPU and the CUDA kernels (TITAN_HD marks them
// __host__ __device__ under nvcc): the fp32 update of one element, and the bf16 storage of the
// moments with stochastic rounding.
//
// Stochastic rounding fp32 -> bf16 (llm.c's adamw.cuh, Megatron's bf16 optimizer state):
// core/stochastic_round.h.
//
// 8-bit moments (bitsandbytes' block-wise dynamic quantization): a block of up to kQ8Block
// elements keeps one fp32 scale, its largest magnitude (absmax), and one byte per element, the
// index of the entry of a 256-value map nearest to element / absmax. The map is signed for m,
// unsigned for v (optim/adamw.h q8_map).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "titan/core/stochastic_round.h"  // TITAN_HD, sr_bits, bf16_stochastic

namespace titan::optim {

// The step's constants: p ← p·decay; m ← m + (1−b1)(g − m); v ← b2·v + (1−b2)·g²;
// p ← p − step_size·m/(sqrt(v)/bc2_sqrt + eps).
struct AdamWConsts {
  float decay, b1, b2, step_size, bc2_sqrt, eps;
};

TITAN_HD void adamw_element(float& p, float g, float& m, float& v, const AdamWConsts& c) {
  p *= c.decay;
  m += (1.0f - c.b1) * (g - m);
  v = c.b2 * v + (1.0f - c.b2) * g * g;
#if defined(__CUDA_ARCH__)
  p -= c.step_size * m / (sqrtf(v) / c.bc2_sqrt + c.eps);
#else
  p -= c.step_size * m / (std::sqrt(v) / c.bc2_sqrt + c.eps);
#endif
}

using titan::bf16_stochastic;
using titan::bf16_to_float;
using titan::f32_bits;
using titan::kGoldenGamma;
using titan::sr_bits;

// Elements per block of the 8-bit state (bitsandbytes' AdamW8bit blocksize since 0.45).
constexpr int64_t kQ8Block = 256;

// The index of the entry of the sorted 256-value `map` nearest to x (the lower one on a tie; x
// below map[0] gives 0): the largest i with map[i] <= x by bisection, then i + 1 when strictly
// nearer. bitsandbytes' CUDA quantizer picks the nearest entry too; its CPU backend (0.50) rounds
// x to one of 65,536 evenly spaced bins first, which near 0 (entries 1e-7 apart) picks a
// neighbour.
TITAN_HD uint8_t q8_encode(float x, const float* map) {
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (map[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo < 255 && map[lo] <= x && map[lo + 1] - x < x - map[lo]) ++lo;
  return static_cast<uint8_t>(lo);
}

// A block's n values x encoded with the scale absmax (> 0: x · (1/absmax), as bitsandbytes
// multiplies; 0: every code that of the value 0).
TITAN_HD void q8_encode_block(const float* x, int64_t n, float absmax, const float* map,
                              uint8_t* out) {
  const float inv = absmax > 0 ? 1.0f / absmax : 0.0f;
  for (int64_t i = 0; i < n; ++i) out[i] = q8_encode(x[i] * inv, map);
}

}  // namespace titan::optim
