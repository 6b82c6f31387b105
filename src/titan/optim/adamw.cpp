#include "titan/optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

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

// One block of the 8-bit state (adamw_step_q8): decoded, updated, encoded with its new absmax.
TITAN_CLONES void adamw_block_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float& absmax_m,
                                 float& absmax_v, int64_t n, const AdamWConsts c,
                                 const float* map_m, const float* map_v) {
  float mb[kQ8Block], vb[kQ8Block];
  float top_m = 0, top_v = 0;
  for (int64_t i = 0; i < n; ++i) {
    float mi = map_m[m[i]] * absmax_m, vi = map_v[v[i]] * absmax_v;
    adamw_element(p[i], g[i], mi, vi, c);
    mb[i] = mi;
    vb[i] = vi;
    top_m = std::max(top_m, std::fabs(mi));
    top_v = std::max(top_v, std::fabs(vi));
  }
  absmax_m = top_m;
  absmax_v = top_v;
  q8_encode_block(mb, n, top_m, map_m, m);
  q8_encode_block(vb, n, top_v, map_v, v);
}

// bitsandbytes' create_dynamic_map in torch's float32 arithmetic: for exponents 10^-6 .. 10^0,
// the midpoints of torch.linspace(0.1, 1, k + 1) scaled by the exponent (k = 2^i fractions signed,
// 2^(i+1) unsigned; signed maps add the negatives), then 0 and 1, sorted.
std::array<float, 256> dynamic_map(bool is_signed) {
  std::vector<float> d;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    // torch.linspace's float32 kernel: start + step·k for the first half, end − step·(items−1−k)
    // for the rest, each a fused multiply-add (one rounding).
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / static_cast<float>(items - 1);
    std::vector<float> b(static_cast<size_t>(items));
    for (int64_t k = 0; k < items; ++k)
      b[static_cast<size_t>(k)] = k < items / 2
                                      ? std::fma(step, static_cast<float>(k), start)
                                      : std::fma(-step, static_cast<float>(items - 1 - k), end);
    const auto scale = static_cast<float>(std::pow(10.0, -6 + i));
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      d.push_back(scale * mean);
      if (is_signed) d.push_back(-(scale * mean));
    }
  }
  d.push_back(0.0f);
  d.push_back(1.0f);
  std::sort(d.begin(), d.end());
  std::array<float, 256> out{};
  std::copy(d.begin(), d.end(), out.begin());
  return out;
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

const float* q8_map(bool is_signed) {
  static const std::array<float, 256> s = dynamic_map(true), u = dynamic_map(false);
  return is_signed ? s.data() : u.data();
}

void adamw_step_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                   float* absmax_v, const int64_t* begin, int64_t nblocks, const AdamWConfig& c,
                   float lr, int64_t step) {
  const AdamWConsts k = adamw_consts(c, lr, step);
  const float *map_m = q8_map(true), *map_v = q8_map(false);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i0 = begin[b], len = begin[b + 1] - i0;
    adamw_block_q8(p + i0, g + i0, m + i0, v + i0, absmax_m[b], absmax_v[b], len, k, map_m,
                   map_v);
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
