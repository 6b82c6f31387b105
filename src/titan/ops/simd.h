// Helpers for loops the compiler vectorizes: CPU dispatch by function clones (the loader picks
// the clone the CPU supports), and an exp that vectorizes (scalar expf does not).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TITAN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TITAN_CLONES
#endif

namespace titan::ops {

// exp(x) for float, max relative error about 2 ulp (Cody-Waite reduction and the Cephes expf
// polynomial). Returns 0 below -87.3 (where expf denormalizes) and clamps above 88.3.
inline float exp_fast(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  return y * std::bit_cast<float>(e << 23);
}

// Σ x[i]·y[i] with 16 independent float lanes in a fixed order: vectorizes without reassociation
// flags, and the result does not depend on threads. (Static: each kernel file gets its clones.)
TITAN_CLONES static inline float dot16(const float* x, const float* y, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * y[i + j];
  float s = 0.f;
  for (; i < n; ++i) s += x[i] * y[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

}  // namespace titan::ops
