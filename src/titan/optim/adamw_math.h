// AdamW's per-element maths, written once for the CPU and the CUDA kernels (TITAN_HD marks them
// __host__ __device__ under nvcc): the fp32 update of one element, and the bf16 storage of the
// moments with stochastic rounding.
//
// Stochastic rounding fp32 -> bf16 (llm.c's adamw.cuh, Megatron's bf16 optimizer state): the low
// 16 bits of the fp32 pattern are discarded after adding 16 uniform random bits r, so x rounds up
// with probability (its low 16 bits)/2^16: E[round(x)] = x (unbiased), which keeps small updates
// that round-to-nearest would lose. r comes from a counter-based hash of (key, element index):
// the same for every thread count and run with the same key. NaN stays NaN; a value past the
// largest bf16 may round to inf, as rounding up does.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TITAN_HD __host__ __device__ __forceinline__
#else
#define TITAN_HD inline
#endif

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

// The golden-ratio increment of splitmix64's counter: element i's counter is key + i·φ.
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// 32 uniform bits for element i under key (a 64 -> 32 bit mix of key + i·φ; Stafford's Mix13
// finalizer).
TITAN_HD uint32_t sr_bits(uint64_t key, uint64_t i) {
  uint64_t x = key + i * kGoldenGamma;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((x ^ (x >> 31)) >> 32);
}

TITAN_HD uint32_t f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

TITAN_HD float bf16_to_float(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

// x rounded to bf16 stochastically with the random bits r (their low 16 used).
TITAN_HD uint16_t bf16_stochastic(float x, uint32_t r) {
  const uint32_t b = f32_bits(x);
  if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0)  // NaN: quiet, sign kept
    return static_cast<uint16_t>((b >> 16) | 0x0040u);
  return static_cast<uint16_t>((b + (r & 0xFFFFu)) >> 16);
}

}  // namespace titan::optim
