#include "titan/ops/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/ops/rope_op.h"
#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

TITAN_CLONES void norm_row_fwd(const float* x, const float* w, float* y, int64_t n, float r) {
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// dx = r·(dy⊙w - x̂·c), c = mean(dy⊙w⊙x̂); accumulates dw_row += dy ⊙ x̂.
TITAN_CLONES void norm_row_bwd(const float* dy, const float* x, const float* w, float r, float* dx,
                               float* dw_acc, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += dy[i + j] * w[i + j] * x[i + j];
  float s = 0.f;
  for (; i < n; ++i) s += dy[i] * w[i] * x[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  float c = s * r * r / static_cast<float>(n);  // mean(g ⊙ x̂)·rstd, x̂ = x·r
  for (int64_t k = 0; k < n; ++k) {
    dx[k] = r * (dy[k] * w[k] - x[k] * c);
    dw_acc[k] += dy[k] * x[k] * r;
  }
}

TITAN_CLONES void rope_row(float* x, const float* cs, int64_t half, float sign) {
  const float* c = cs;
  const float* s = cs + half;
  for (int64_t j = 0; j < half; ++j) {
    float x1 = x[j], x2 = x[j + half], sn = sign * s[j];
    x[j] = x1 * c[j] - x2 * sn;
    x[j + half] = x2 * c[j] + x1 * sn;
  }
}

TITAN_CLONES void swiglu_row_fwd(const float* a, const float* b, float* g, int64_t F) {
  for (int64_t i = 0; i < F; ++i) {
    float sig = 1.0f / (1.0f + exp_fast(-a[i]));
    g[i] = a[i] * sig * b[i];
  }
}

TITAN_CLONES void swiglu_row_bwd(const float* dg, const float* a, const float* b, float* da,
                                 float* db, int64_t F) {
  for (int64_t i = 0; i < F; ++i) {
    float sig = 1.0f / (1.0f + exp_fast(-a[i]));
    float silu = a[i] * sig;
    db[i] = dg[i] * silu;
    da[i] = dg[i] * b[i] * (sig * (1.0f + a[i] * (1.0f - sig)));
  }
}

TITAN_CLONES void add_row(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

constexpr int64_t kChunk =
    1 << 14;  // elementwise work unit: fixed, so results never depend on threads

}  // namespace

namespace {
void check_ids(const int32_t* ids, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t)
    check(ids[t] >= 0 && ids[t] < V, "token id " + std::to_string(ids[t]) + " at position " +
                                         std::to_string(t) + " is outside the vocabulary [0, " +
                                         std::to_string(V) +
                                         "); check the tokenizer and model.vocab_size");
}
}  // namespace

void embedding_fwd(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t D,
                   float* out) {
  embedding_fwd_range(ids, T, table, V, 0, V, D, out);
}

void embedding_fwd_range(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t v0,
                         int64_t vl, int64_t D, float* out) {
  check_ids(ids, T, V);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] >= v0 && ids[t] < v0 + vl)
      std::copy_n(table + (ids[t] - v0) * D, D, out + t * D);
    else
      std::fill_n(out + t * D, D, 0.0f);
  }
}

void embedding_bwd(const int32_t* ids, int64_t T, const float* dout, int64_t D, float* dtable) {
  embedding_bwd_range(ids, T, dout, 0, std::numeric_limits<int32_t>::max(), D, dtable);
}

void embedding_bwd_range(const int32_t* ids, int64_t T, const float* dout, int64_t v0, int64_t vl,
                         int64_t D, float* dtable) {
  // Each thread owns a slice of columns and walks all tokens in order: no races, fixed order.
#pragma omp parallel
  {
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t c0 = D * id / nt, c1 = D * (id + 1) / nt;
    for (int64_t t = 0; t < T; ++t) {
      if (ids[t] < v0 || ids[t] >= v0 + vl) continue;
      float* dst = dtable + (ids[t] - v0) * D;
      const float* src = dout + t * D;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void rmsnorm_fwd(const NormRows& s, const float* x, const float* w, float eps, float* y,
                 float* rstd) {
  const int64_t rows = s.T * s.H;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = r / s.H, h = r % s.H;
    const float* xr = x + t * s.ldx + h * s.N;
    float ss = dot16(xr, xr, s.N);
    float rs = 1.0f / std::sqrt(ss / static_cast<float>(s.N) + eps);
    rstd[r] = rs;
    norm_row_fwd(xr, w, y + t * s.ldy + h * s.N, s.N, rs);
  }
}

// dw partial sums go to a fixed number of row blocks (not one per thread), so the reduction
// order, and so the result, is the same for every thread count.
static constexpr int64_t kNormBlocks = 32;

int64_t rmsnorm_bwd_scratch(const NormRows& s) { return kNormBlocks * s.N; }

void rmsnorm_bwd(const NormRows& s, const float* dy, const float* x, const float* w,
                 const float* rstd, float* dx, float* dw, float* scratch) {
  const int64_t rows = s.T * s.H;
  const int64_t nb = std::min<int64_t>(kNormBlocks, std::max<int64_t>(rows, 1));
  std::fill_n(scratch, nb * s.N, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    float* acc = scratch + b * s.N;
    for (int64_t r = rows * b / nb; r < rows * (b + 1) / nb; ++r) {
      int64_t t = r / s.H, h = r % s.H;
      norm_row_bwd(dy + t * s.ldy + h * s.N, x + t * s.ldx + h * s.N, w, rstd[r],
                   dx + t * s.ldx + h * s.N, acc, s.N);
    }
  }
  if (dw)  // null: a frozen weight (no gradient wanted)
    for (int64_t b = 0; b < nb; ++b) add_row(dw, scratch + b * s.N, dw, s.N);
}

void rope_table(int64_t max_pos, int64_t d, double theta, float* cos_sin) {
  rope_table_host(max_pos, d, theta, cos_sin);
}

int64_t first_bad_position(const int32_t* pos, int64_t n, int64_t limit) {
  for (int64_t t = 0; t < n; ++t)
    if (pos[t] < 0 || pos[t] >= limit) return t;
  return -1;
}

void rope_fwd(float* x, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      rope_row(x + t * ldx + h * d, cos_sin + positions[t] * d, d / 2, 1.0f);
}

void rope_bwd(float* dx, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      rope_row(dx + t * ldx + h * d, cos_sin + positions[t] * d, d / 2, -1.0f);
}

RopeOp cos_sin_rope_op() {
  RopeOp op;
  op.name = "cos_sin_rope";
  op.forward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                  const int32_t* pos, const float* cs) { rope_fwd(x, B * S, H, d, ldx, pos, cs); };
  op.backward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                   const int32_t* pos, const float* cs) { rope_bwd(x, B * S, H, d, ldx, pos, cs); };
  return op;
}

void swiglu_fwd(const float* ab, float* g, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) swiglu_row_fwd(ab + t * 2 * F, ab + t * 2 * F + F, g + t * F, F);
}

void swiglu_bwd(const float* dg, const float* ab, float* dab, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    swiglu_row_bwd(dg + t * F, ab + t * 2 * F, ab + t * 2 * F + F, dab + t * 2 * F,
                   dab + t * 2 * F + F, F);
}

void add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + kChunk - 1) / kChunk; ++c) {
    int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
    add_row(a + i0, b + i0, out + i0, len);
  }
}

void add_inplace(float* y, const float* x, int64_t n) { add(y, x, y, n); }

void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void copy_rows(const float* src, int64_t src_stride, const int32_t* src_row, float* dst,
               int64_t dst_stride, const int32_t* dst_row, int64_t n, int64_t width) {
#pragma omp parallel for schedule(static) if (n * width > kChunk)
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src + (src_row ? src_row[i] : i) * src_stride;
    float* d = dst + (dst_row ? dst_row[i] : i) * dst_stride;
    for (int64_t c = 0; c < width; ++c) d[c] = s[c];
  }
}

void sum_rows(const float* src, int64_t src_stride, const int32_t* index, int64_t k, float* dst,
              int64_t n, int64_t width) {
#pragma omp parallel for schedule(static) if (n * width > kChunk)
  for (int64_t t = 0; t < n; ++t) {
    float* d = dst + t * width;
    for (int64_t c = 0; c < width; ++c) d[c] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float* s = src + index[t * k + j] * src_stride;
      for (int64_t c = 0; c < width; ++c) d[c] += s[c];
    }
  }
}

void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p) {
  const float keep = static_cast<float>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k)
    y[k] =
        uniform_open(random_u64(seed, stream, static_cast<uint64_t>(k))) >= p ? x[k] * keep : 0.0f;
}

void dropout_add(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p) {
  const float keep = static_cast<float>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k)
    if (uniform_open(random_u64(seed, stream, static_cast<uint64_t>(k))) >= p) y[k] += x[k] * keep;
}

namespace {
// Round to nearest even on the bit pattern (the compiler vectorizes the select); a NaN stays a
// quiet NaN with its sign, as core/dtype.h's f32_to.
TITAN_CLONES void to_bf16_row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    y[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
}  // namespace

void to_bf16(const float* x, int64_t n, uint16_t* y) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    to_bf16_row(x, y, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk;
    to_bf16_row(x + i0, y + i0, std::min(kChunk, n - i0));
  }
}

void from_bf16(const uint16_t* x, int64_t n, float* y) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    for (int64_t i = 0; i < m; ++i)
      y[i0 + i] = std::bit_cast<float>(static_cast<uint32_t>(x[i0 + i]) << 16);
  }
}

}  // namespace titan::ops
