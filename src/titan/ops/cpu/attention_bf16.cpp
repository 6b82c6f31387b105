// Attention of bf16 mixed precision: the same contract as attention_fwd / attention_bwd
// (attention.h: shapes, GQA, causal and block-causal masks, lse saved, backward from lse), with
// every product of the attention (Q·Kᵀ, P·V, dO·Vᵀ, dS·K, dSᵀ·Q, Pᵀ·dO) a bf16 oneDNN GEMM with
// fp32 accumulation, as torch.autocast runs SDPA in bf16. Scores, the softmax, lse, delta and the
// softmax backward stay fp32.
//
// Blocking: per (batch row b, query head h, block of kBq queries [i0, i1)), the keys the block can
// see, [j0, i1) with j0 the block's lowest segment start, form one score block S[nr, N]
// (N = i1 − j0 ≤ S), so each product is one GEMM of shape about [kBq, d]·[d, N]: large enough for
// oneDNN's AMX / AVX512-BF16 kernels, and the causal waste is at most the upper half of the
// diagonal [kBq, kBq] square. Memory per call: bf16 copies of q, k, v (and dout in the backward)
// plus one score block set of kBq·S values, never S·S.
//
//   forward:  S = bf16(q_b,h)·bf16(k)ᵀ·scale (+ mask), lse = log Σ exp S, P = exp(S − lse),
//             o = bf16(P)·bf16(v)
//   backward: P recomputed from lse; dP = bf16(dout)·bf16(v)ᵀ; dS = P ⊙ (dP − delta)·scale;
//             dq = bf16(dS)·bf16(k); dk += bf16(dS)ᵀ·bf16(q); dv += bf16(P)ᵀ·bf16(dout)
//             (dk, dv summed over the query heads of a kv head in a fixed order).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "titan/ops/attention.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"
#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

constexpr int64_t kBq = 128;  // queries per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// bf16 copies of x[T, H, d] (token stride ldx) as compact [T, H·d].
void heads_to_bf16(const float* x, int64_t ldx, int64_t T, int64_t Hd, uint16_t* out) {
  if (ldx == Hd) {
    to_bf16(x, T * Hd, out);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) to_bf16(x + t * ldx, Hd, out + t * Hd);
}

// The layout of one call's workspace (in floats): bf16 q, k, v, dout, then the score blocks.
struct Work {
  uint16_t *q, *k, *v, *dout, *pb, *dsb;
  float *s, *dp, *rowmax;
};
Work carve(const AttnShape& s, float* ws) {
  const int64_t T = s.B * s.S, Tk = s.B * s.keys(), Sk = s.keys(), Hq = s.Hq * s.d,
                Hk = s.Hkv * s.d;
  auto even = [](int64_t n) { return (n + 31) / 32 * 32; };  // bf16 counts, 64-byte multiples
  Work w;
  w.q = reinterpret_cast<uint16_t*>(ws);
  w.k = w.q + even(T * Hq);
  w.v = w.k + even(Tk * Hk);
  w.dout = w.v + even(Tk * Hk);
  w.pb = w.dout + even(T * Hq);
  w.dsb = w.pb + even(kBq * Sk);
  w.s = reinterpret_cast<float*>(w.dsb + even(kBq * Sk));
  w.dp = w.s + kBq * Sk;
  w.rowmax = w.dp + kBq * Sk;
  return w;
}

// The first key of the block's score columns: the lowest segment start of rows [i0, i1) rounded
// down to a multiple of kBq, so that the GEMM shapes (and oneDNN's primitive cache) take at most
// S/kBq + 1 widths whatever the document boundaries; the mask hides the extra keys.
int64_t first_key(const int32_t* seg, int64_t i0, int64_t i1) {
  int64_t lo = seg[i0];
  for (int64_t i = i0; i < i1; ++i) lo = std::min<int64_t>(lo, seg[i]);
  return lo / kBq * kBq;
}

// Scales row i of the score block, masks what query i0+i (key qi = q0+i0+i) may not see (key
// j0+j visible iff seg[i0+i] <= j0+j <= qi), and returns the row's max (−inf when nothing is visible).
TITAN_CLONES float mask_scale_row(float* row, int64_t N, int64_t j0, int64_t qi, int64_t lo,
                                  float scale) {
  float mx = kNegInf;
  for (int64_t j = 0; j < N; ++j) {
    const int64_t kj = j0 + j;
    row[j] = (kj > qi || kj < lo) ? kNegInf : row[j] * scale;
    mx = std::max(mx, row[j]);
  }
  return mx;
}

// row ← exp(row − m) (0 where masked); returns the sum.
TITAN_CLONES float exp_row_sum(float* row, int64_t N, float m) {
  float sum = 0.f;
  for (int64_t j = 0; j < N; ++j) {
    row[j] = row[j] == kNegInf ? 0.f : exp_fast(row[j] - m);
    sum += row[j];
  }
  return sum;
}

// Backward of the softmax on one row: p = exp(s − lse), g ← p ⊙ (g − delta)·scale.
TITAN_CLONES void softmax_grad_row(float* p, float* g, int64_t N, float lse, float delta,
                                   float scale) {
  for (int64_t j = 0; j < N; ++j) {
    p[j] = p[j] == kNegInf ? 0.f : exp_fast(p[j] - lse);
    g[j] = p[j] * (g[j] - delta) * scale;
  }
}

// Calls fn(b, h, kvh, seg, i0, nr, j0, N) for every (batch row, query head, block of kBq queries
// [i0, i0 + nr)) with its key range [j0, j0 + N) (N reaching key q0 + i0 + nr − 1), in a fixed
// order.
template <typename Fn>
void for_each_block(const AttnShape& s, const int32_t* seg_start, Fn&& fn) {
  for (int64_t b = 0; b < s.B; ++b) {
    const int32_t* seg = seg_start + b * s.S;
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i0 = 0; i0 < s.S; i0 += kBq) {
        const int64_t i1 = std::min(s.S, i0 + kBq), j0 = first_key(seg, i0, i1);
        fn(b, h, h / (s.Hq / s.Hkv), seg, i0, i1 - i0, j0, s.q0 + i1 - j0);
      }
  }
}

// The masked, scaled scores of block (b, h, [i0, i1)) against keys [j0, i1) into w.s [nr, N].
void scores(const AttnShape& s, const Work& w, const int32_t* seg, int64_t b, int64_t h, int64_t i0,
            int64_t nr, int64_t j0, int64_t N, float* rowmax) {
  const int64_t ldq = s.Hq * s.d, ldk = s.Hkv * s.d, kvh = h / (s.Hq / s.Hkv);
  gemm_bf16(false, true, nr, N, s.d, w.q + (b * s.S + i0) * ldq + h * s.d, ldq,
            w.k + (b * s.keys() + j0) * ldk + kvh * s.d, ldk, w.s, N, false);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nr; ++i)
    rowmax[i] = mask_scale_row(w.s + i * N, N, j0, s.q0 + i0 + i, seg[i0 + i], s.scale);
}

}  // namespace

int64_t attention_bf16_workspace(const AttnShape& s) {
  const int64_t T = s.B * s.S, Tk = s.B * s.keys();
  auto even = [](int64_t n) { return (n + 31) / 32 * 32; };
  return (2 * even(T * s.Hq * s.d) + 2 * even(Tk * s.Hkv * s.d) + 2 * even(kBq * s.keys())) / 2 +
         2 * kBq * s.keys() + kBq;
}

void attention_fwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const int32_t* seg_start, float* o, float* lse, float* workspace) {
  const Work w = carve(s, workspace);
  const int64_t T = s.B * s.S, Tk = s.B * s.keys(), d = s.d, ldo = s.Hq * d, ldk = s.Hkv * d;
  float* rowmax = w.rowmax;
  heads_to_bf16(q, s.ldq, T, s.Hq * d, w.q);
  heads_to_bf16(k, s.ldk, Tk, ldk, w.k);
  heads_to_bf16(v, s.ldv, Tk, ldk, w.v);
  for_each_block(s, seg_start,
                 [&](int64_t b, int64_t h, int64_t kvh, const int32_t* seg, int64_t i0, int64_t nr,
                     int64_t j0, int64_t N) {
                   scores(s, w, seg, b, h, i0, nr, j0, N, rowmax);
                   float* lrow = lse + (b * s.Hq + h) * s.S + i0;
#pragma omp parallel for schedule(static)
                   for (int64_t i = 0; i < nr; ++i) {
                     float* row = w.s + i * N;
                     const float sum =
                         exp_row_sum(row, N, rowmax[i]);  // key i is always visible: sum >= 1
                     const float inv = 1.0f / sum;
                     for (int64_t j = 0; j < N; ++j) row[j] *= inv;
                     lrow[i] = rowmax[i] + std::log(sum);
                     to_bf16(row, N, w.pb + i * N);
                   }
                   gemm_bf16(false, false, nr, d, N, w.pb, N,
                             w.v + (b * s.keys() + j0) * ldk + kvh * d,
                             ldk, o + (b * s.S + i0) * ldo + h * d, ldo, false);
                 });
}

void attention_bwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout,
                        const int32_t* seg_start, float* dq, float* dk, float* dv, float* delta,
                        float* workspace) {
  const Work w = carve(s, workspace);
  const int64_t T = s.B * s.S, Sk = s.keys(), d = s.d, ldo = s.Hq * d, ldk = s.Hkv * d;
  heads_to_bf16(q, s.ldq, T, ldo, w.q);
  heads_to_bf16(k, s.ldk, s.B * Sk, ldk, w.k);
  heads_to_bf16(v, s.ldv, s.B * Sk, ldk, w.v);
  heads_to_bf16(dout, ldo, T, ldo, w.dout);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < T * s.Hq; ++r) {
    const int64_t t = r / s.Hq, h = r % s.Hq, b = t / s.S, i = t % s.S;
    delta[(b * s.Hq + h) * s.S + i] = dot16(dout + t * ldo + h * d, o + t * ldo + h * d, d);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < (s.accumulate ? 0 : s.B * Sk); ++t) {
    std::fill_n(dk + t * s.ldk, ldk, 0.f);
    std::fill_n(dv + t * s.ldv, ldk, 0.f);
  }
  for_each_block(
      s, seg_start,
      [&](int64_t b, int64_t h, int64_t kvh, const int32_t* seg, int64_t i0, int64_t nr, int64_t j0,
          int64_t N) {
        const int64_t qrow = (b * s.S + i0) * ldo + h * d, krow = (b * Sk + j0) * ldk + kvh * d;
        scores(s, w, seg, b, h, i0, nr, j0, N, w.rowmax);
        gemm_bf16(false, true, nr, N, d, w.dout + qrow, ldo, w.v + krow, ldk, w.dp, N, false);
        const float* lrow = lse + (b * s.Hq + h) * s.S + i0;
        const float* drow = delta + (b * s.Hq + h) * s.S + i0;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nr; ++i) {
          softmax_grad_row(w.s + i * N, w.dp + i * N, N, lrow[i], drow[i], s.scale);
          to_bf16(w.s + i * N, N, w.pb + i * N);
          to_bf16(w.dp + i * N, N, w.dsb + i * N);
        }
        gemm_bf16(false, false, nr, d, N, w.dsb, N, w.k + krow, ldk, dq + qrow, ldo, false);
        gemm_bf16(true, false, N, d, nr, w.dsb, N, w.q + qrow, ldo,
                  dk + (b * Sk + j0) * s.ldk + kvh * d, s.ldk, true);
        gemm_bf16(true, false, N, d, nr, w.pb, N, w.dout + qrow, ldo,
                  dv + (b * Sk + j0) * s.ldv + kvh * d, s.ldv, true);
      });
}

}  // namespace titan::ops
