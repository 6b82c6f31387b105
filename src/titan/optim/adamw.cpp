#include "titan/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "titan/ops/simd.h"
#include "titan/optim/adamw_math.h"

namespace titan::optim {
namespace {
constexpr int64_t kBlock = 1 << 14;

TITAN_CLONES void adamw_block(float* p, const float* g, float* m, float* v, int64_t n,
                              const AdamWConsts c) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], g[i], m[i], v[i], c);
}

// i0: the index of element 0 in the whole buffer (the random bits' counter).
TITAN_CLONES void adamw_block_bf16(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                                   int64_t i0, const AdamWConsts c, uint64_t key) {
  for (int64_t i = 0; i < n; ++i) {
    float mi = bf16_to_float(m[i]), vi = bf16_to_float(v[i]);
    adamw_element(p[i], g[i], mi, vi, c);
    const uint32_t r = sr_bits(key, static_cast<uint64_t>(i0 + i));
    m[i] = bf16_stochastic(mi, r);
    v[i] = bf16_stochastic(vi, r >> 16);
  }
}

TITAN_CLONES double sq_block(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  double s = 0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  for (int j = 0; j < 8; ++j) s += acc[j];
  return s;
}
}  // namespace

AdamWConsts adamw_consts(const AdamWConfig& c, float lr, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(step));
  return {1.0f - lr * c.weight_decay,         c.beta1, c.beta2, static_cast<float>(lr / bc1),
          static_cast<float>(std::sqrt(bc2)), c.eps};
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConfig& c,
                float lr, int64_t step) {
  const AdamWConsts k = adamw_consts(c, lr, step);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    adamw_block(p + i0, g + i0, m + i0, v + i0, len, k);
  }
}

void adamw_step_bf16(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                     const AdamWConfig& c, float lr, int64_t step, uint64_t key) {
  const AdamWConsts k = adamw_consts(c, lr, step);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + kBlock - 1) / kBlock; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    adamw_block_bf16(p + i0, g + i0, m + i0, v + i0, len, i0, k, key);
  }
}

double sum_squares(const float* x, int64_t n) {
  // Partial sums per fixed block, added in block order: independent of the thread count.
  constexpr int64_t kBatch = 1024;
  double parts[kBatch];
  double total = 0;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  for (int64_t b0 = 0; b0 < nb; b0 += kBatch) {
    const int64_t cnt = std::min(kBatch, nb - b0);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < cnt; ++b) {
      const int64_t i0 = (b0 + b) * kBlock;
      parts[b] = sq_block(x + i0, std::min(kBlock, n - i0));
    }
    for (int64_t b = 0; b < cnt; ++b) total += parts[b];
  }
  return total;
}

void clip_by_norm(float* g, int64_t n, double norm, double max_norm) {
  const double coef = std::min(1.0, max_norm / (norm + 1e-6));
  if (coef >= 1.0) return;
  const float c = static_cast<float>(coef);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= c;
}

}  // namespace titan::optim
