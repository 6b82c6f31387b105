// Counter-based random numbers: value i of stream s under seed k is a pure function of (k, s, i),
// so initialization is identical for every thread count and every sharding of a tensor.
#pragma once
#include <cstdint>

namespace titan {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1), 53 random bits.
inline double uniform_open(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Fills out[0..n) with Normal(mean, std) for stream `stream` under `seed` (Box-Muller, in double).
void fill_normal(float* out, int64_t n, float mean, float std, uint64_t seed, uint64_t stream);
// Elements [first, first + n) of the same stream (a slice of a tensor filled whole by
// fill_normal: a tensor-parallel rank's rows or columns get the values the whole tensor has).
void fill_normal_range(float* out, int64_t first, int64_t n, float mean, float std, uint64_t seed,
                       uint64_t stream);

// Uniform 64-bit value number i of (seed, stream).
inline uint64_t random_u64(uint64_t seed, uint64_t stream, uint64_t i) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream + 0x632BE59BD9B4E019ull)) + i);
}

}  // namespace titan
