// The routed experts of one MoE layer (ops/experts_op.h): two kernel pairs.
//
//   forward:  y[t] = Σ_{j<K} w[t,j] · W2[e] · ( silu(W1[e]·x[t]) ⊙ W3[e]·x[t] ),  e = idx[t,j]
//             x[T,D], idx[T,K] int32 in [0,E), w[T,K]; w1, w3 [E,F,D]; w2 [E,D,F]; y[T,D].
//   backward: dx[T,D] and dw[T,K] written; dw1, dw3 [E,F,D] and dw2 [E,D,F] accumulated.
//
// "grouped_experts": the N = T·K (token, slot) pairs are sorted by expert (a counting sort,
// stable in token order, so the layout and every sum below are fixed by idx alone). Pair (t,j)
// goes to row pos(t,j) of the permuted buffers; expert e owns rows [off[e], off[e] + n_e).
//   xp[N,D]    xp[pos(t,j)] = x[t]
//   h[N,2F]    h_e = [ xp_e·W1[e]ᵀ | xp_e·W3[e]ᵀ ]      (two GEMMs into one row, ldc = 2F)
//   g[N,F]     g = silu(h[:, :F]) ⊙ h[:, F:]            (ops::swiglu_fwd)
//   yp[N,D]    yp_e = g_e·W2[e]ᵀ
//   y[t]       Σ_j w[t,j]·yp[pos(t,j)], summed in slot order j = 0..K-1 (no atomics)
// Every product is an ops::gemm_rows call per expert and projection (M or K = n_e is a oneDNN
// runtime dimension, so the primitive cache stays bounded whatever the routing). The GEMMs of a
// pass are split into work items, each run whole on one thread (one OpenMP loop over the items,
// largest first; oneDNN does not nest, so each item's GEMM is single-threaded): expert e's rows
// in ceil(n_e / 512) equal blocks, or for a weight gradient the same number of blocks of its
// output rows. The split is by work (tokens × experts), so one hot expert spreads over all
// threads, and it depends on the routing alone, not on the thread count: so do the results.
// The forward saves h and the permutation; the backward regathers xp and recomputes g from h
// (both cheap).
// The backward uses dw[t,j] = dy[t]·yp[pos] = (W2ᵀ·dy[t])·g[pos], so yp need not be saved:
//   du[N,D]    du[pos(t,j)] = dy[t]          (unweighted)
//   dgu_e      du_e·W2[e]                    dw[t,j] = dgu[pos]·g[pos]
//   dg, gw     w[t,j]·dgu[pos], w[t,j]·g[pos]  (so dg = dyp·W2 with dyp = w·dy)
//   dW2[e]    += du_eᵀ·gw_e                   (= dyp_eᵀ·g_e)
//   dh         ops::swiglu_bwd(dg, h)
//   dxp_e      dh_e[:, :F]·W1[e] + dh_e[:, F:]·W3[e]
//   dW1[e]    += dh_e[:, :F]ᵀ·xp_e,  dW3[e] += dh_e[:, F:]ᵀ·xp_e
//   dx[t]      Σ_j dxp[pos(t,j)] in slot order.
//
// The bf16 op ("grouped_experts" under dtype bfloat16) runs the same steps with each GEMM's
// activation operand (xp, g, du, gw, dh) rounded to bf16 and the bf16 weight copies; xp and du
// are gathered straight into bf16 (their fp32 copies are never needed).
//
// "grouped_experts_reference": per (token, slot) the expert MLP in double, no oneDNN; for tests
// and titan check-kernel.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/gemm.h"
#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// ---- Row helpers (memory-bound, vectorized by the clones).
TITAN_CLONES void row_scale(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}
TITAN_CLONES void row_scale_inplace(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}
TITAN_CLONES void row_axpy(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
TITAN_CLONES void row_add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void check_shape(const ExpertsShape& s) {
  check(s.T >= 0 && s.D > 0 && s.F > 0 && s.E > 0 && s.K > 0,
        "grouped_experts: need T >= 0 and positive D, F, E, K (got T=" + std::to_string(s.T) +
            " D=" + std::to_string(s.D) + " F=" + std::to_string(s.F) +
            " E=" + std::to_string(s.E) + " K=" + std::to_string(s.K) + ")");
  check(s.T * s.K < std::numeric_limits<int32_t>::max(),
        "grouped_experts: T·K = " + std::to_string(s.T * s.K) + " routed rows exceed int32");
}

void check_idx(const ExpertsShape& s, const int32_t* idx) {
  const int64_t n = s.T * s.K;
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; ++i)
    if (idx[i] < 0 || idx[i] >= s.E) bad = i;
  if (bad >= 0)
    throw Error("grouped_experts: expert index " + std::to_string(idx[bad]) + " of token " +
                std::to_string(bad / s.K) + " slot " + std::to_string(bad % s.K) +
                " is outside [0, " + std::to_string(s.E) + ")");
}

// ---- grouped_experts: buffer layouts.
// saved:   h [round16(N·2F)] | off [E+1] int32 | pos [N] int32
// scratch: forward  xp [N·D] | yp [N·D] | g [N·F]
//          backward xp [N·D] | du/dxp [N·D] | g/gw [N·F] | dg [N·F] | dh [N·2F]
// (every part rounded up to 16 floats, so each starts 64-byte aligned when the base is). The
// int32 parts live in the float buffer and are only ever accessed as int32.
struct Saved {
  float* h;
  int32_t* off;
  int32_t* pos;
};

Saved saved_view(const ExpertsShape& s, float* saved) {
  const int64_t N = s.T * s.K;
  float* p = saved + round16(N * 2 * s.F);
  int32_t* off = reinterpret_cast<int32_t*>(p);
  return {saved, off, off + (s.E + 1)};
}

int64_t grouped_saved_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return round16(N * 2 * s.F) + round16(s.E + 1 + N);
}

int64_t grouped_scratch_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return 2 * round16(N * s.D) + 2 * round16(N * s.F) + round16(N * 2 * s.F);
}

// The bf16 op adds bf16 copies of the GEMMs' activation operands after the fp32 scratch:
// forward xp [N·D] | g [N·F]; backward xp [N·D] | du [N·D] | gw [N·F] | dh [N·2F] (in bf16
// values, each part a multiple of 32).
int64_t grouped_bf16_scratch_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return grouped_scratch_floats(s) + (2 * round16(2 * N * s.D) + 3 * round16(2 * N * s.F)) / 2;
}

struct Bf16Parts {
  uint16_t *xp = nullptr, *du = nullptr, *g = nullptr, *dh = nullptr;  // g: g (fwd) or gw (bwd)
};
Bf16Parts bf16_parts(const ExpertsShape& s, float* scratch) {
  const int64_t N = s.T * s.K;
  Bf16Parts p;
  p.xp = reinterpret_cast<uint16_t*>(scratch + grouped_scratch_floats(s));
  p.du = p.xp + round16(2 * N * s.D);
  p.g = p.du + round16(2 * N * s.D);
  p.dh = p.g + round16(2 * N * s.F);
  return p;
}

// One expert GEMM (gemm_rows semantics): C = op(A)·op(B) with the fp32 operands, or with their
// bf16 copies (ab, bb) in the bf16 op.
void expert_gemm(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a,
                 const uint16_t* ab, int64_t lda, const float* b, const uint16_t* bb, int64_t ldb,
                 float* c, int64_t ldc, bool acc) {
  if (M == 0) return;  // an empty block of a split expert
  if (bf16)
    gemm_rows_bf16(ta, tb, M, N, K, ab, lda, bb, ldb, c, ldc, acc);
  else
    gemm_rows(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, acc);
}
// p + i, or null for a null p (the bf16 copies are null in the fp32 op).
template <typename T>
T* at(T* p, int64_t i) {
  return p ? p + i : nullptr;
}

// ---- Work items: expert e's part `part` of `parts` (see the file comment).
constexpr int64_t kRowsPerItem = 512;

struct Item {
  int32_t e, part, parts;
  int64_t rows;  // the expert's routed rows / parts: the item's share of the work
};

// The items of the experts with tokens, largest first (ties: expert, then part), so the dynamic
// schedule below ends with the small ones.
std::vector<Item> work_items(const ExpertsShape& s, const int32_t* off) {
  std::vector<Item> items;
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    const int64_t parts = (n + kRowsPerItem - 1) / kRowsPerItem;
    for (int64_t p = 0; p < parts; ++p)
      items.push_back({static_cast<int32_t>(e), static_cast<int32_t>(p),
                       static_cast<int32_t>(parts), n / parts});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.rows != b.rows) return a.rows > b.rows;
    return a.e != b.e ? a.e < b.e : a.part < b.part;
  });
  return items;
}

// Block `part` of `parts` of [0, len): [begin, end), the boundaries multiples of 16 but the last.
struct Range {
  int64_t begin, end;
};
Range block(int64_t len, const Item& it) {
  auto edge = [&](int64_t p) { return p == it.parts ? len : len * p / it.parts / 16 * 16; };
  return {edge(it.part), edge(it.part + 1)};
}

// The item's rows of the permuted buffers, inside expert e's [off[e], off[e+1]).
Range item_rows(const Item& it, const int32_t* off) {
  const Range r = block(off[it.e + 1] - off[it.e], it);
  return {off[it.e] + r.begin, off[it.e] + r.end};
}

// fn(item) for every item, each on one thread. An exception (a GEMM that cannot allocate, say)
// must not leave the OpenMP region: the first is kept, the items not yet started are skipped,
// and it is rethrown on the calling thread.
template <typename Fn>
void for_items(const std::vector<Item>& items, Fn&& fn) {
  const int64_t n = static_cast<int64_t>(items.size());
  std::exception_ptr failed;
  std::atomic<bool> stop{false};
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    if (stop.load(std::memory_order_relaxed)) continue;
    try {
      fn(items[i]);
    } catch (...) {
#pragma omp critical(titan_experts_failed)
      if (!failed) failed = std::current_exception();
      stop = true;
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// Counting sort of the (t, j) pairs by expert, stable in token order: off[E+1] (exclusive
// prefix sum of the counts) and pos[t·K + j], the permuted row of pair (t, j).
void route(const ExpertsShape& s, const int32_t* idx, int32_t* off, int32_t* pos) {
  const int64_t N = s.T * s.K;
  std::fill_n(off, s.E + 1, 0);
  for (int64_t i = 0; i < N; ++i) ++off[idx[i] + 1];
  for (int64_t e = 0; e < s.E; ++e) off[e + 1] += off[e];
  std::vector<int32_t> cursor(off, off + s.E);
  for (int64_t i = 0; i < N; ++i) pos[i] = cursor[idx[i]]++;
}

// xp[pos(t,j)] = x[t] for all pairs (each row written once: parallel over tokens); or, when xpb
// is given (the bf16 op), only its bf16 rounding xpb[pos(t,j)] = bf16(x[t]), and xp is not written.
void scatter_rows(const ExpertsShape& s, const int32_t* pos, const float* x, float* xp,
                  uint16_t* xpb) {
  const int64_t D = s.D, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      if (xpb)
        to_bf16(x + t * D, D, xpb + pos[t * K + j] * D);
      else
        std::copy_n(x + t * D, D, xp + pos[t * K + j] * D);
    }
}

void grouped_forward_any(const ExpertsArgs& a, float* y, bool bf16) {
  const ExpertsShape& s = a.s;
  check_shape(s);
  if (s.T == 0) return;
  check_idx(s, a.idx);
  const int64_t N = s.T * s.K, D = s.D, F = s.F, K = s.K;
  const Saved sv = saved_view(s, a.saved);
  route(s, a.idx, sv.off, sv.pos);
  float* xp = a.scratch;
  float* yp = xp + round16(N * D);
  float* g = yp + round16(N * D);
  const Bf16Parts b = bf16 ? bf16_parts(s, a.scratch) : Bf16Parts{};
  scatter_rows(s, sv.pos, a.x, xp, b.xp);
  const std::vector<Item> items = work_items(s, sv.off);
  for_items(items, [&](const Item& it) {
    const Range r = item_rows(it, sv.off);
    const int64_t e = it.e, o = r.begin, n = r.end - r.begin;
    expert_gemm(bf16, false, true, n, F, D, xp + o * D, at(b.xp, o * D), D, a.w1 + e * F * D,
                at(a.w1_bf16, e * F * D), D, sv.h + o * 2 * F, 2 * F, false);
    expert_gemm(bf16, false, true, n, F, D, xp + o * D, at(b.xp, o * D), D, a.w3 + e * F * D,
                at(a.w3_bf16, e * F * D), D, sv.h + o * 2 * F + F, 2 * F, false);
  });
  swiglu_fwd(sv.h, g, N, F);
  if (bf16) to_bf16(g, N * F, b.g);
  for_items(items, [&](const Item& it) {
    const Range r = item_rows(it, sv.off);
    const int64_t e = it.e, o = r.begin, n = r.end - r.begin;
    expert_gemm(bf16, false, true, n, D, F, g + o * F, at(b.g, o * F), F, a.w2 + e * D * F,
                at(a.w2_bf16, e * D * F), F, yp + o * D, D, false);
  });
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.T; ++t) {
    float* yt = y + t * D;
    row_scale(yt, yp + sv.pos[t * K] * D, a.w[t * K], D);
    for (int64_t j = 1; j < K; ++j) row_axpy(yt, yp + sv.pos[t * K + j] * D, a.w[t * K + j], D);
  }
}

// Backward of grouped_forward_any (same arguments; reads the h and permutation it saved).
void grouped_backward_any(const ExpertsArgs& a, const ExpertsGrads& gr, bool bf16) {
  const ExpertsShape& s = a.s;
  check_shape(s);
  if (s.T == 0) return;
  const int64_t N = s.T * s.K, D = s.D, F = s.F, K = s.K;
  const Saved sv = saved_view(s, a.saved);
  float* xp = a.scratch;
  float* du = xp + round16(N * D);  // later dxp
  float* g = du + round16(N * D);   // later gw
  float* dg = g + round16(N * F);
  float* dh = dg + round16(N * F);
  const Bf16Parts b = bf16 ? bf16_parts(s, a.scratch) : Bf16Parts{};
  scatter_rows(s, sv.pos, a.x, xp, b.xp);
  scatter_rows(s, sv.pos, gr.dy, du, b.du);
  swiglu_fwd(sv.h, g, N, F);
  const std::vector<Item> items = work_items(s, sv.off);
  for_items(items, [&](const Item& it) {
    const Range r = item_rows(it, sv.off);
    const int64_t e = it.e, o = r.begin, n = r.end - r.begin;
    expert_gemm(bf16, false, false, n, F, D, du + o * D, at(b.du, o * D), D, a.w2 + e * D * F,
                at(a.w2_bf16, e * D * F), F, dg + o * F, F, false);
  });
  // dw[t,j] = dy[t]·yp[pos] = (dy[t]·W2[e])·g[pos]; then weight the rows of dg and g.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t p = sv.pos[t * K + j];
      const float wt = a.w[t * K + j];
      gr.dw[t * K + j] = dot16(dg + p * F, g + p * F, F);
      row_scale_inplace(dg + p * F, wt, F);
      row_scale_inplace(g + p * F, wt, F);
    }
  if (bf16) to_bf16(g, N * F, b.g);
  // dW2[e] += du_eᵀ·gw_e, the item's block of dW2's D rows (all of the expert's tokens).
  if (gr.dw2)  // null: frozen experts
    for_items(items, [&](const Item& it) {
      const int64_t e = it.e, o = sv.off[e], n = sv.off[e + 1] - o;
      const Range d = block(D, it);
      expert_gemm(bf16, true, false, d.end - d.begin, F, n, du + o * D + d.begin,
                  at(b.du, o * D + d.begin), D, g + o * F, at(b.g, o * F), F,
                  gr.dw2 + (e * D + d.begin) * F, F, true);
    });
  swiglu_bwd(dg, sv.h, dh, N, F);
  if (bf16) to_bf16(dh, N * 2 * F, b.dh);
  float* dxp = du;
  // ∂/∂(W1·x) in columns [0,F) of dh, ∂/∂(W3·x) at + F. Each item: its rows of dxp, and its
  // block of the F rows of dW1[e] and dW3[e] (all of the expert's tokens).
  for_items(items, [&](const Item& it) {
    const Range r = item_rows(it, sv.off);
    const int64_t e = it.e, o = r.begin, n = r.end - r.begin;
    const float* dha = dh + o * 2 * F;
    const uint16_t* dhb = at(b.dh, o * 2 * F);
    expert_gemm(bf16, false, false, n, D, F, dha, dhb, 2 * F, a.w1 + e * F * D,
                at(a.w1_bf16, e * F * D), D, dxp + o * D, D, false);
    expert_gemm(bf16, false, false, n, D, F, dha + F, at(dhb, F), 2 * F, a.w3 + e * F * D,
                at(a.w3_bf16, e * F * D), D, dxp + o * D, D, true);
    if (!gr.dw1) return;  // frozen experts
    const int64_t oe = sv.off[e], ne = sv.off[e + 1] - oe;
    const Range f = block(F, it);
    const float* dhe = dh + oe * 2 * F + f.begin;
    const uint16_t* dheb = at(b.dh, oe * 2 * F + f.begin);
    const uint16_t* xpb = at(b.xp, oe * D);
    expert_gemm(bf16, true, false, f.end - f.begin, D, ne, dhe, dheb, 2 * F, xp + oe * D, xpb, D,
                gr.dw1 + (e * F + f.begin) * D, D, true);
    expert_gemm(bf16, true, false, f.end - f.begin, D, ne, dhe + F, at(dheb, F), 2 * F, xp + oe * D,
                xpb, D, gr.dw3 + (e * F + f.begin) * D, D, true);
  });
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.T; ++t) {
    float* dxt = gr.dx + t * D;
    std::copy_n(dxp + sv.pos[t * K] * D, D, dxt);
    for (int64_t j = 1; j < K; ++j) row_add(dxt, dxp + sv.pos[t * K + j] * D, D);
  }
}

// ---- grouped_experts_reference: the expert MLP of one (token, expert) pair in double.
struct PairAct {
  std::vector<double> a, b, g, yp;  // W1·x, W3·x, silu(a)⊙b [F]; W2·g [D]
};

void pair_forward(const ExpertsArgs& ar, int64_t t, int64_t e, PairAct& p) {
  const int64_t D = ar.s.D, F = ar.s.F;
  const float* xt = ar.x + t * D;
  p.a.assign(F, 0.0), p.b.assign(F, 0.0), p.g.assign(F, 0.0), p.yp.assign(D, 0.0);
  for (int64_t f = 0; f < F; ++f) {
    const float* r1 = ar.w1 + (e * F + f) * D;
    const float* r3 = ar.w3 + (e * F + f) * D;
    double s1 = 0, s3 = 0;
    for (int64_t d = 0; d < D; ++d) {
      s1 += static_cast<double>(r1[d]) * xt[d];
      s3 += static_cast<double>(r3[d]) * xt[d];
    }
    p.a[f] = s1, p.b[f] = s3;
    p.g[f] = s1 / (1.0 + std::exp(-s1)) * s3;
  }
  for (int64_t d = 0; d < D; ++d) {
    const float* r2 = ar.w2 + (e * D + d) * F;
    double acc = 0;
    for (int64_t f = 0; f < F; ++f) acc += static_cast<double>(r2[f]) * p.g[f];
    p.yp[d] = acc;
  }
}

// Given dyp[D] = w·dy[t]: da = ∂L/∂(W1·x), db = ∂L/∂(W3·x) [F].
void pair_backward(const ExpertsArgs& ar, int64_t e, const PairAct& p, const double* dyp,
                   std::vector<double>& da, std::vector<double>& db) {
  const int64_t D = ar.s.D, F = ar.s.F;
  da.assign(F, 0.0), db.assign(F, 0.0);
  std::vector<double> dg(F, 0.0);
  for (int64_t d = 0; d < D; ++d) {
    const float* r2 = ar.w2 + (e * D + d) * F;
    for (int64_t f = 0; f < F; ++f) dg[f] += dyp[d] * r2[f];
  }
  for (int64_t f = 0; f < F; ++f) {
    const double sig = 1.0 / (1.0 + std::exp(-p.a[f]));
    db[f] = dg[f] * p.a[f] * sig;
    da[f] = dg[f] * p.b[f] * sig * (1.0 + p.a[f] * (1.0 - sig));
  }
}

void reference_forward(const ExpertsArgs& a, float* y) {
  const ExpertsShape& s = a.s;
  check_shape(s);
  check_idx(s, a.idx);
  const int64_t D = s.D, K = s.K;
#pragma omp parallel
  {
    PairAct p;
    std::vector<double> acc(D);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < s.T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        pair_forward(a, t, a.idx[t * K + j], p);
        const double wt = a.w[t * K + j];
        for (int64_t d = 0; d < D; ++d) acc[d] += wt * p.yp[d];
      }
      for (int64_t d = 0; d < D; ++d) y[t * D + d] = static_cast<float>(acc[d]);
    }
  }
}

// Backward of reference_forward: dx and dw per token (parallel over tokens), then dW1, dW3, dW2
// per expert over its tokens in token order (parallel over experts), accumulated in double.
void reference_backward(const ExpertsArgs& a, const ExpertsGrads& gr) {
  const ExpertsShape& s = a.s;
  check_shape(s);
  check_idx(s, a.idx);
  const int64_t D = s.D, F = s.F, K = s.K;
#pragma omp parallel
  {
    PairAct p;
    std::vector<double> dyp(D), da, db, dx(D);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < s.T; ++t) {
      std::fill(dx.begin(), dx.end(), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = a.idx[t * K + j];
        pair_forward(a, t, e, p);
        double dwt = 0;
        for (int64_t d = 0; d < D; ++d) {
          dwt += static_cast<double>(gr.dy[t * D + d]) * p.yp[d];
          dyp[d] = static_cast<double>(a.w[t * K + j]) * gr.dy[t * D + d];
        }
        gr.dw[t * K + j] = static_cast<float>(dwt);
        pair_backward(a, e, p, dyp.data(), da, db);
        for (int64_t f = 0; f < F; ++f) {
          const float* r1 = a.w1 + (e * F + f) * D;
          const float* r3 = a.w3 + (e * F + f) * D;
          for (int64_t d = 0; d < D; ++d) dx[d] += da[f] * r1[d] + db[f] * r3[d];
        }
      }
      for (int64_t d = 0; d < D; ++d) gr.dx[t * D + d] = static_cast<float>(dx[d]);
    }
  }
#pragma omp parallel
  {
    PairAct p;
    std::vector<double> dyp(D), da, db, g1, g3, g2;
#pragma omp for schedule(dynamic, 1)
    for (int64_t e = 0; e < s.E; ++e) {
      bool any = false;
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t j = 0; j < K; ++j) {
          if (a.idx[t * K + j] != e) continue;
          if (!any) {
            g1.assign(F * D, 0.0);
            g3.assign(F * D, 0.0);
            g2.assign(D * F, 0.0);
            any = true;
          }
          pair_forward(a, t, e, p);
          for (int64_t d = 0; d < D; ++d)
            dyp[d] = static_cast<double>(a.w[t * K + j]) * gr.dy[t * D + d];
          pair_backward(a, e, p, dyp.data(), da, db);
          const float* xt = a.x + t * D;
          for (int64_t f = 0; f < F; ++f)
            for (int64_t d = 0; d < D; ++d) {
              g1[f * D + d] += da[f] * xt[d];
              g3[f * D + d] += db[f] * xt[d];
            }
          for (int64_t d = 0; d < D; ++d)
            for (int64_t f = 0; f < F; ++f) g2[d * F + f] += dyp[d] * p.g[f];
        }
      if (!any || !gr.dw1) continue;
      for (int64_t i = 0; i < F * D; ++i) {
        gr.dw1[e * F * D + i] += static_cast<float>(g1[i]);
        gr.dw3[e * F * D + i] += static_cast<float>(g3[i]);
        gr.dw2[e * D * F + i] += static_cast<float>(g2[i]);
      }
    }
  }
}

}  // namespace

GroupedExpertsOp grouped_experts_op() {
  GroupedExpertsOp op;
  op.name = "grouped_experts";
  op.device = "cpu";
  op.dtype = "float32";
  op.saved_floats = grouped_saved_floats;
  op.scratch_floats = grouped_scratch_floats;
  op.forward = [](const ExpertsArgs& a, float* y) { grouped_forward_any(a, y, false); };
  op.backward = [](const ExpertsArgs& a, const ExpertsGrads& g) {
    grouped_backward_any(a, g, false);
  };
  op.check = check_shape;
  return op;
}

GroupedExpertsOp grouped_experts_bf16_op() {
  GroupedExpertsOp op = grouped_experts_op();
  op.dtype = "bfloat16";
  op.scratch_floats = grouped_bf16_scratch_floats;
  auto need_copies = [](const ExpertsArgs& a) {
    check(a.w1_bf16 && a.w3_bf16 && a.w2_bf16,
          "grouped_experts (bfloat16) needs the bf16 weight copies (ExpertsArgs::w*_bf16)");
  };
  op.forward = [need_copies](const ExpertsArgs& a, float* y) {
    need_copies(a);
    grouped_forward_any(a, y, true);
  };
  op.backward = [need_copies](const ExpertsArgs& a, const ExpertsGrads& g) {
    need_copies(a);
    grouped_backward_any(a, g, true);
  };
  return op;
}

GroupedExpertsOp grouped_experts_reference_op() {
  GroupedExpertsOp op;
  op.name = "grouped_experts_reference";
  op.device = "cpu";
  op.dtype = "float32";
  op.saved_floats = [](const ExpertsShape&) -> int64_t { return 0; };
  op.scratch_floats = [](const ExpertsShape&) -> int64_t { return 0; };
  op.forward = reference_forward;
  op.backward = reference_backward;
  op.check = check_shape;
  return op;
}

}  // namespace titan::ops
