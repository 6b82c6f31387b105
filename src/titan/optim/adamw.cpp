#include "titan/optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "titan/core/error.h"
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

// q8_encode by tables instead of bisection, the same index. thr[k] is the least float that
// q8_encode puts at k + 1 rather than k (between map[k] and map[k + 1]), so x's index is the
// number of thresholds <= x. start, at the top 20 bits of x (a bucket 1/2048 of an octave wide),
// counts them for the bucket's least value; no bucket holds a threshold past its least value
// but one (checked when built), so one comparison more gives x's.
struct Q8Table {
  static constexpr int kShift = 12;
  const float* map;
  float thr[256];              // thr[255] = +inf
  std::vector<uint8_t> start;  // 2^20 buckets
  explicit Q8Table(const float* m) : map(m), start(size_t{1} << (32 - kShift)) {
    // Floats as integers in their order (negatives' patterns reversed), to bisect over.
    const auto ord = [](float x) {
      const uint32_t b = f32_bits(x);
      return b & 0x80000000u ? ~b : b | 0x80000000u;
    };
    const auto from_ord = [](uint32_t o) {
      const uint32_t b = o & 0x80000000u ? o & 0x7FFFFFFFu : ~o;
      float f;
      std::memcpy(&f, &b, sizeof f);
      return f;
    };
    for (int k = 0; k < 255; ++k) {  // the least float in (m[k], m[k + 1]] encoded to k + 1
      uint32_t lo = ord(m[k]), hi = ord(m[k + 1]);
      while (lo + 1 < hi) {  // from_ord(lo) encodes to k or below, from_ord(hi) to k + 1
        const uint32_t mid = lo + (hi - lo) / 2;
        (q8_encode(from_ord(mid), m) <= k ? lo : hi) = mid;
      }
      thr[k] = from_ord(hi);
    }
    thr[255] = std::numeric_limits<float>::infinity();
    const auto count = [this](float x) {  // the thresholds <= x
      return static_cast<int>(std::upper_bound(thr, thr + 255, x) - thr);
    };
    for (uint32_t key = 0; key < (uint32_t{1} << (32 - kShift)); ++key) {
      const uint32_t low = (uint32_t{1} << kShift) - 1;
      const bool neg = (key >> (31 - kShift)) != 0;
      const uint32_t lb = key << kShift | (neg ? low : 0u), hb = key << kShift | (neg ? 0u : low);
      float least, most;
      std::memcpy(&least, &lb, sizeof least);
      std::memcpy(&most, &hb, sizeof most);
      const int c = std::isnan(least) ? 0 : count(least);
      start[key] = static_cast<uint8_t>(c);
      check(std::isnan(least) || count(most) - c <= 1,
            "8-bit AdamW: an encoding bucket holds two thresholds");
    }
  }
  uint8_t encode(float x) const {
    const int i = start[f32_bits(x) >> kShift];
    return static_cast<uint8_t>(i + (thr[i] <= x));
  }
  // q8_encode_block's codes.
  void encode_block(const float* x, int64_t n, float absmax, uint8_t* out) const {
    const float inv = absmax > 0 ? 1.0f / absmax : 0.0f;
    for (int64_t i = 0; i < n; ++i) out[i] = encode(x[i] * inv);
  }
};

const Q8Table& q8_table(bool is_signed) {
  static const Q8Table s(q8_map(true)), u(q8_map(false));
  return is_signed ? s : u;
}

// The largest |x[i]|: the largest of the magnitudes' bit patterns (ordered as the values are), an
// integer reduction the compiler vectorizes.
TITAN_CLONES float absmax_of(const float* x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, f32_bits(x[i]) & 0x7FFFFFFFu);
  float r;
  std::memcpy(&r, &top, sizeof r);
  return r;
}

// One block of the 8-bit state (adamw_step_q8): decoded and updated (a loop the compiler
// vectorizes), then its new absmax, then encoded.
TITAN_CLONES void adamw_block_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float& absmax_m,
                                 float& absmax_v, int64_t n, const AdamWConsts c, const Q8Table& tm,
                                 const Q8Table& tv) {
  float mb[kQ8Block], vb[kQ8Block];  // [0, n) written below, then read (GCC sees no bound)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  const float am = absmax_m, av = absmax_v;
  for (int64_t i = 0; i < n; ++i) {
    float mi = tm.map[m[i]] * am, vi = tv.map[v[i]] * av;
    adamw_element(p[i], g[i], mi, vi, c);
    mb[i] = mi;
    vb[i] = vi;
  }
  const float top_m = absmax_of(mb, n), top_v = absmax_of(vb, n);
  absmax_m = top_m;
  absmax_v = top_v;
  tm.encode_block(mb, n, top_m, m);
  tv.encode_block(vb, n, top_v, v);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
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

uint8_t q8_encode_fast(float x, bool is_signed) { return q8_table(is_signed).encode(x); }

const float* q8_map(bool is_signed) {
  static const std::array<float, 256> s = dynamic_map(true), u = dynamic_map(false);
  return is_signed ? s.data() : u.data();
}

void adamw_step_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                   float* absmax_v, const int64_t* begin, int64_t nblocks, const AdamWConfig& c,
                   float lr, int64_t step) {
  const AdamWConsts k = adamw_consts(c, lr, step);
  const Q8Table &tm = q8_table(true), &tv = q8_table(false);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i0 = begin[b], len = begin[b + 1] - i0;
    adamw_block_q8(p + i0, g + i0, m + i0, v + i0, absmax_m[b], absmax_v[b], len, k, tm, tv);
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
