#include "titan/core/rng.h"

#include <cmath>

namespace titan {

void fill_normal(float* out, int64_t n, float mean, float std, uint64_t seed, uint64_t stream) {
#pragma omp parallel for schedule(static)
  for (int64_t pair = 0; pair < (n + 1) / 2; ++pair) {
    double u1 = uniform_open(random_u64(seed, stream, 2 * static_cast<uint64_t>(pair)));
    double u2 = uniform_open(random_u64(seed, stream, 2 * static_cast<uint64_t>(pair) + 1));
    double r = std::sqrt(-2.0 * std::log(u1));
    double a = 2.0 * M_PI * u2;
    out[2 * pair] = static_cast<float>(mean + std * r * std::cos(a));
    if (2 * pair + 1 < n) out[2 * pair + 1] = static_cast<float>(mean + std * r * std::sin(a));
  }
}

void fill_normal_range(float* out, int64_t first, int64_t n, float mean, float std, uint64_t seed,
                       uint64_t stream) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const auto pair = static_cast<uint64_t>((first + i) / 2);
    double u1 = uniform_open(random_u64(seed, stream, 2 * pair));
    double u2 = uniform_open(random_u64(seed, stream, 2 * pair + 1));
    double r = std::sqrt(-2.0 * std::log(u1));
    double a = 2.0 * M_PI * u2;
    out[i] =
        static_cast<float>(mean + std * r * ((first + i) % 2 == 0 ? std::cos(a) : std::sin(a)));
  }
}

}  // namespace titan
