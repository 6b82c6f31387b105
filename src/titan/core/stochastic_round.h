// Stochastic rounding fp32 -> bf16 with counter-based random bits, written once for the CPU and
// the CUDA kernels (TITAN_HD marks them __host__ __device__ under nvcc): the bf16 AdamW moments
// (optim/adamw_math.h) and the bf16 master weights (models/param_store.h, parallel/fsdp.h).
// 16 uniform random bits r are added to the fp32 pattern before its low 16 bits are dropped, so x
// rounds up with probability (its low 16 bits)/2^16: E[round(x)] = x. r is a hash of (key,
// element index): the same for every thread count and run with the same key. NaN stays NaN.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TITAN_HD __host__ __device__ __forceinline__
#else
#define TITAN_HD inline
#endif

namespace titan {

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

// x[0, n) rounded to bf16 stochastically into out: element i's random bits are
// sr_bits(key, first + i), so the result does not depend on the thread count or on how a range is
// split (core/dtype.cpp).
void round_bf16_stochastic(const float* x, int64_t n, uint64_t key, int64_t first, uint16_t* out);

}  // namespace titan
