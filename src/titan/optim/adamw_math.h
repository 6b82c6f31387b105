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
//
// 8-bit moments (bitsandbytes' block-wise dynamic quantization): a block of up to kQ8Block
// elements keeps one fp32 scale, its largest magnitude (absmax), and one byte per element, the
// index of the entry of a 256-value map nearest to element / absmax. The map is signed for m,
// unsigned for v (optim/adamw.h q8_map).
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
