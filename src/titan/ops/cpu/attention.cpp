#include "titan/ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile micro-kernel. Every tile product in this file is one call of
//   out[r, 0:n] += Σ_{s < ns} c[r·cr + s·cs] · src[s·lds + 0:n]      for r < nr
// register-blocked as 2 rows × 32 columns (8 vector accumulators) with GCC vector types, so the
// compiler emits the widest FMA the dispatched clone has.
using v8f = float __attribute__((vector_size(32), aligned(4)));
// load8/store8 are always inlined into the dispatched clones, so the vector-return ABI note
// (which concerns calls across translation units) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

template <int NV>
__attribute__((always_inline)) inline void rank_update_block(
    const float* __restrict__ c, int64_t cr, int64_t cs, const float* __restrict__ src, int64_t lds,
    int64_t r, int64_t nr, int64_t ns, int64_t col, float* __restrict__ out, int64_t ldo) {
  if (r + 2 <= nr) {
    v8f a0[NV], a1[NV];
    for (int v = 0; v < NV; ++v) {
      a0[v] = load8(out + r * ldo + col + 8 * v);
      a1[v] = load8(out + (r + 1) * ldo + col + 8 * v);
    }
    for (int64_t s2 = 0; s2 < ns; ++s2) {
      const float c0 = c[r * cr + s2 * cs], c1 = c[(r + 1) * cr + s2 * cs];
      const float* row = src + s2 * lds + col;
      for (int v = 0; v < NV; ++v) {
        const v8f b = load8(row + 8 * v);
        a0[v] += c0 * b;
        a1[v] += c1 * b;
      }
    }
    for (int v = 0; v < NV; ++v) {
      store8(out + r * ldo + col + 8 * v, a0[v]);
      store8(out + (r + 1) * ldo + col + 8 * v, a1[v]);
    }
  } else {
    v8f a0[NV];
    for (int v = 0; v < NV; ++v) a0[v] = load8(out + r * ldo + col + 8 * v);
    for (int64_t s2 = 0; s2 < ns; ++s2) {
      const float c0 = c[r * cr + s2 * cs];
      const float* row = src + s2 * lds + col;
      for (int v = 0; v < NV; ++v) a0[v] += c0 * load8(row + 8 * v);
    }
    for (int v = 0; v < NV; ++v) store8(out + r * ldo + col + 8 * v, a0[v]);
  }
}

TITAN_CLONES void rank_update(const float* c, int64_t cr, int64_t cs, const float* src, int64_t lds,
                              int64_t nr, int64_t ns, int64_t n, float* out, int64_t ldo) {
  for (int64_t r = 0; r < nr; r += 2) {
    int64_t col = 0;
    for (; col + 32 <= n; col += 32)
      rank_update_block<4>(c, cr, cs, src, lds, r, nr, ns, col, out, ldo);
    for (; col + 8 <= n; col += 8)
      rank_update_block<1>(c, cr, cs, src, lds, r, nr, ns, col, out, ldo);
    for (; col < n; ++col)
      for (int64_t rr = r; rr < std::min(nr, r + 2); ++rr) {
        float acc = out[rr * ldo + col];
        for (int64_t s2 = 0; s2 < ns; ++s2) acc += c[rr * cr + s2 * cs] * src[s2 * lds + col];
        out[rr * ldo + col] = acc;
      }
  }
}

// st[i, 0:kBc] = Σ_k a[i, k] · bt[k, 0:kBc]   (a: [nr, d] row stride lda; bt: [d, ≥kBc] row
// stride ldb)
void tile_abt(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t nr, int64_t d,
              float* st) {
  std::fill_n(st, nr * kBc, 0.f);
  rank_update(a, lda, 1, bt, ldb, nr, d, kBc, st, kBc);
}

// out[i, 0:d] += Σ_j p[i, j] · b[j, 0:d]   (p: [nr, kBc]; b rows with stride ldb)
void tile_pb(const float* p, const float* b, int64_t ldb, int64_t nr, int64_t nc, int64_t d,
             float* out, int64_t ldo) {
  rank_update(p, kBc, 1, b, ldb, nr, nc, d, out, ldo);
}

// out[j, 0:d] += Σ_i p[i, j] · a[i, 0:d]   (the tile used transposed)
void tile_ptb(const float* p, const float* a, int64_t lda, int64_t nr, int64_t nc, int64_t d,
              float* out, int64_t ldo) {
  rank_update(p, 1, kBc, a, lda, nc, nr, d, out, ldo);
}

// Row-wise: p[j] = exp(s[j]·1 - m) for visible j, else 0; returns Σ p.
inline float exp_row(float* s, float m, int64_t n) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    float e = s[j] == kNegInf ? 0.f : exp_fast(s[j] - m);
    s[j] = e;
    sum += e;
  }
  return sum;
}

// Fills the [nr, kBc] score tile st = (qs · kᵀ) with the mask applied (-inf where hidden).
// q rows are already scaled; kt points at the tile's first column of the transposed keys
// (row stride ldk). Rows i0.., keys j0.. within one sequence; query i is key q0 + i.
void masked_scores(const float* qs, int64_t ldqs, const float* kt, int64_t ldk, int64_t i0,
                   int64_t nr, int64_t j0, int64_t nc, int64_t d, const int32_t* seg, int64_t q0,
                   float* st) {
  tile_abt(qs, ldqs, kt, ldk, nr, d, st);
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t qi = q0 + i0 + i, lo = seg[i0 + i];
    float* row = st + i * kBc;
    for (int64_t j = 0; j < kBc; ++j) {
      const int64_t kj = j0 + j;
      if (j >= nc || kj > qi || kj < lo) row[j] = kNegInf;
    }
  }
}

// Online-softmax update of one score tile (forward): per row, new max, rescale of the running
// sum l and accumulator acc[nr, d], and st turned into unnormalized probabilities.
TITAN_CLONES void online_softmax_tile(float* st, int64_t nr, float* m, float* l, float* acc,
                                      int64_t d) {
  for (int64_t i = 0; i < nr; ++i) {
    float* row = st + i * kBc;
    float mx = m[i];
    for (int64_t j = 0; j < kBc; ++j) mx = std::max(mx, row[j]);
    if (mx == kNegInf) {  // nothing visible in this tile for this row
      for (int64_t j = 0; j < kBc; ++j) row[j] = 0.f;
      continue;
    }
    const float corr = m[i] == kNegInf ? 0.f : exp_fast(m[i] - mx);
    l[i] = l[i] * corr + exp_row(row, mx, kBc);
    m[i] = mx;
    float* a = acc + i * d;
    for (int64_t c = 0; c < d; ++c) a[c] *= corr;
  }
}

// Backward of the softmax on one tile: p = exp(s − lse) (0 where masked), and
// dp ← p ⊙ (dp − delta) · scale.
TITAN_CLONES void softmax_grad_tile(float* st, float* dp, int64_t nr, const float* lse,
                                    const float* delta, float scale) {
  for (int64_t i = 0; i < nr; ++i) {
    float* p = st + i * kBc;
    float* g = dp + i * kBc;
    const float li = lse[i], di = delta[i];
    for (int64_t j = 0; j < kBc; ++j) {
      p[j] = p[j] == kNegInf ? 0.f : exp_fast(p[j] - li);
      g[j] = p[j] * (g[j] - di) * scale;
    }
  }
}

TITAN_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float r = 0.f;
  for (; i < n; ++i) r += a[i] * b[i];
  for (int j = 0; j < 8; ++j) r += acc[j];
  return r;
}

// Keys (or values) transposed once per call: xt[b, h, c, j] = x[b·S + j, h, c], zero-padded to
// Sp = a whole number of key tiles, so every tile is a column block of a [d, Sp] matrix.
void transpose_heads(const float* x, int64_t ldx, int64_t B, int64_t S, int64_t H, int64_t d,
                     int64_t Sp, float* xt) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      float* dst = xt + (b * H + h) * d * Sp;
      for (int64_t j0 = 0; j0 < Sp; j0 += 16) {  // 16 keys at a time for locality
        for (int64_t c = 0; c < d; ++c)
          for (int64_t j = j0; j < j0 + 16; ++j)
            dst[c * Sp + j] = j < S ? x[(b * S + j) * ldx + h * d + c] : 0.f;
      }
    }
}

// Key-tile range [kb0, kb1) that query rows [i0, i1) (keys q0 + i0 .. q0 + i1 - 1) can see.
inline void key_tiles(const int32_t* seg, int64_t q0, int64_t i0, int64_t i1, int64_t* kb0,
                      int64_t* kb1) {
  int64_t lo = seg[i0];
  for (int64_t i = i0; i < i1; ++i) lo = std::min<int64_t>(lo, seg[i]);
  *kb0 = lo / kBc;
  *kb1 = (q0 + i1 - 1) / kBc + 1;
}

}  // namespace

void attention_segments(const int32_t* positions, int64_t B, int64_t S, bool block_causal,
                        int32_t* seg_start) {
  for (int64_t b = 0; b < B; ++b) {
    int32_t start = 0;
    for (int64_t i = 0; i < S; ++i) {
      if (block_causal && i > 0 && positions[b * S + i] == 0) start = static_cast<int32_t>(i);
      seg_start[b * S + i] = start;
    }
  }
}

namespace {
int64_t padded_seq(const AttnShape& s) { return (s.keys() + kBc - 1) / kBc * kBc; }
// Per thread: qs[Br,d] + st[Br,Bc] + dp[Br,Bc] + acc[Br,d] + m[Br] + l[Br] (+ alignment slack)
int64_t per_thread(const AttnShape& s) { return 2 * kBr * s.d + 2 * kBr * kBc + 2 * kBr + 64; }
}  // namespace

int64_t attention_workspace(const AttnShape& s) {
  return 2 * s.B * s.Hkv * s.d * padded_seq(s) + omp_get_max_threads() * per_thread(s);
}

void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const int32_t* seg_start, float* o, float* lse, float* workspace) {
  const int64_t nqt = (s.S + kBr - 1) / kBr, group = s.Hq / s.Hkv, d = s.d, Sp = padded_seq(s);
  const int64_t Sk = s.keys();
  float* kT = workspace;  // [B, Hkv, d, Sp]
  float* thread_base = workspace + 2 * s.B * s.Hkv * d * Sp;
  transpose_heads(k, s.ldk, s.B, Sk, s.Hkv, d, Sp, kT);
#pragma omp parallel
  {
    float* qs = thread_base + omp_get_thread_num() * per_thread(s);
    float* st = qs + kBr * d;
    float* acc = st + kBr * kBc;
    float* m = acc + kBr * d;
    float* l = m + kBr;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.B * s.Hq * nqt; ++task) {
      const int64_t b = task / (s.Hq * nqt), h = (task / nqt) % s.Hq, qt = task % nqt;
      const int64_t i0 = qt * kBr, i1 = std::min(s.S, i0 + kBr), nr = i1 - i0;
      const int32_t* seg = seg_start + b * s.S;
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < nr; ++i) {
        const float* src = q + (b * s.S + i0 + i) * s.ldq + h * d;
        for (int64_t c = 0; c < d; ++c) qs[i * d + c] = src[c] * s.scale;
        std::fill_n(acc + i * d, d, 0.f);
        m[i] = kNegInf;
        l[i] = 0.f;
      }
      int64_t kb0, kb1;
      key_tiles(seg, s.q0, i0, i1, &kb0, &kb1);
      const float* kth = kT + (b * s.Hkv + kvh) * d * Sp;
      for (int64_t kb = kb0; kb < kb1; ++kb) {
        const int64_t j0 = kb * kBc, nc = std::min(Sk, j0 + kBc) - j0;
        masked_scores(qs, d, kth + j0, Sp, i0, nr, j0, nc, d, seg, s.q0, st);
        online_softmax_tile(st, nr, m, l, acc, d);
        tile_pb(st, v + (b * Sk + j0) * s.ldv + kvh * d, s.ldv, nr, nc, d, acc, d);
      }
      for (int64_t i = 0; i < nr; ++i) {
        float* dst = o + (b * s.S + i0 + i) * (s.Hq * d) + h * d;
        const float inv = 1.0f / l[i];
        for (int64_t c = 0; c < d; ++c) dst[c] = acc[i * d + c] * inv;
        lse[(b * s.Hq + h) * s.S + i0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dout, const int32_t* seg_start,
                   float* dq, float* dk, float* dv, float* delta, float* workspace) {
  const int64_t d = s.d, group = s.Hq / s.Hkv, ldo = s.Hq * d, Sp = padded_seq(s);
  const int64_t Sk = s.keys(), nqt = (s.S + kBr - 1) / kBr, nkt = (Sk + kBc - 1) / kBc;
  float* kT = workspace;                  // [B, Hkv, d, Sp]
  float* vT = kT + s.B * s.Hkv * d * Sp;  // [B, Hkv, d, Sp]
  float* thread_base = vT + s.B * s.Hkv * d * Sp;
  transpose_heads(k, s.ldk, s.B, Sk, s.Hkv, d, Sp, kT);
  transpose_heads(v, s.ldv, s.B, Sk, s.Hkv, d, Sp, vT);

  // delta[b,h,i] = Σ_c dout·o  (the softmax backward's row term).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.B * s.S * s.Hq; ++r) {
    const int64_t t = r / s.Hq, h = r % s.Hq, b = t / s.S, i = t % s.S;
    delta[(b * s.Hq + h) * s.S + i] = dot(dout + t * ldo + h * d, o + t * ldo + h * d, d);
  }

  // Recomputes P (probabilities) and dS = P ⊙ (dP − delta) for one (query tile, key tile).
  // On return st = P and dp = dS (already multiplied by scale, for dq and dk).
  auto tile_grads = [&](int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t j0, int64_t nc,
                        const float* qs, float* st, float* dp) {
    const int64_t kvh = h / group;
    const float* kth = kT + (b * s.Hkv + kvh) * d * Sp + j0;
    const float* vth = vT + (b * s.Hkv + kvh) * d * Sp + j0;
    masked_scores(qs, d, kth, Sp, i0, nr, j0, nc, d, seg_start + b * s.S, s.q0, st);
    tile_abt(dout + (b * s.S + i0) * ldo + h * d, ldo, vth, Sp, nr, d, dp);
    const int64_t row = (b * s.Hq + h) * s.S + i0;
    softmax_grad_tile(st, dp, nr, lse + row, delta + row, s.scale);
  };
  auto load_qs = [&](int64_t b, int64_t h, int64_t i0, int64_t nr, float* qs) {
    for (int64_t i = 0; i < nr; ++i) {
      const float* src = q + (b * s.S + i0 + i) * s.ldq + h * d;
      for (int64_t c = 0; c < d; ++c) qs[i * d + c] = src[c] * s.scale;
    }
  };

  // Pass 1: dq, one task per (b, h, query tile).
#pragma omp parallel
  {
    float* qs = thread_base + omp_get_thread_num() * per_thread(s);
    float* st = qs + kBr * d;
    float* dp = st + kBr * kBc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.B * s.Hq * nqt; ++task) {
      const int64_t b = task / (s.Hq * nqt), h = (task / nqt) % s.Hq, qt = task % nqt;
      const int64_t i0 = qt * kBr, nr = std::min(s.S, i0 + kBr) - i0, kvh = h / group;
      float* dqt = dq + (b * s.S + i0) * ldo + h * d;
      for (int64_t i = 0; i < nr; ++i) std::fill_n(dqt + i * ldo, d, 0.f);
      load_qs(b, h, i0, nr, qs);
      int64_t kb0, kb1;
      key_tiles(seg_start + b * s.S, s.q0, i0, i0 + nr, &kb0, &kb1);
      for (int64_t kb = kb0; kb < kb1; ++kb) {
        const int64_t j0 = kb * kBc, nc = std::min(Sk, j0 + kBc) - j0;
        tile_grads(b, h, i0, nr, j0, nc, qs, st, dp);
        tile_pb(dp, k + (b * Sk + j0) * s.ldk + kvh * d, s.ldk, nr, nc, d, dqt, ldo);
      }
    }
  }

  // Pass 2: dk, dv, one task per (b, kv head, key tile), summing over the group's query heads.
#pragma omp parallel
  {
    float* qs = thread_base + omp_get_thread_num() * per_thread(s);
    float* st = qs + kBr * d;
    float* dp = st + kBr * kBc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.B * s.Hkv * nkt; ++task) {
      const int64_t b = task / (s.Hkv * nkt), g = (task / nkt) % s.Hkv, kb = task % nkt;
      const int64_t j0 = kb * kBc, nc = std::min(Sk, j0 + kBc) - j0;
      const int32_t* seg = seg_start + b * s.S;
      float* dkt = dk + (b * Sk + j0) * s.ldk + g * d;
      float* dvt = dv + (b * Sk + j0) * s.ldv + g * d;
      for (int64_t j = 0; !s.accumulate && j < nc; ++j) {
        std::fill_n(dkt + j * s.ldk, d, 0.f);
        std::fill_n(dvt + j * s.ldv, d, 0.f);
      }
      // Query tiles that may see keys [j0, j0+nc): from the first query >= j0 (key q0 + i) up
      // to the last query whose segment starts at or before the tile's last key (segment starts
      // only grow).
      const int64_t qt0 = std::max<int64_t>(0, j0 - s.q0) / kBr;
      int64_t qt_end = nqt;
      for (int64_t qt = qt0; qt < nqt; ++qt) {
        if (seg[qt * kBr] > j0 + nc - 1) {
          qt_end = qt;
          break;
        }
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t qt = qt0; qt < qt_end; ++qt) {
          const int64_t i0 = qt * kBr, nr = std::min(s.S, i0 + kBr) - i0;
          load_qs(b, h, i0, nr, qs);
          tile_grads(b, h, i0, nr, j0, nc, qs, st, dp);
          tile_ptb(st, dout + (b * s.S + i0) * ldo + h * d, ldo, nr, nc, d, dvt, s.ldv);
          tile_ptb(dp, q + (b * s.S + i0) * s.ldq + h * d, s.ldq, nr, nc, d, dkt, s.ldk);
        }
      }
    }
  }
}

}  // namespace titan::ops
