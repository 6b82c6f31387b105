// The grouped-experts op ("grouped_experts", forward + backward) against one dense GEMM chain of
// the same FLOPs: the three projections of a single F-wide SwiGLU MLP on all T·K routed rows
// (forward h = x·[W1;W3]ᵀ, g = swiglu(h), y = g·W2ᵀ; backward dg, dW2, swiglu_bwd, dx, dW1, dW3),
// i.e. what the experts would cost if routing cost nothing and every GEMM were one large one.
// Routing is uniform: each token picks K distinct experts at random; the *_skewed row sends half
// the tokens to expert 0 (max_expert_rows and mean_expert_rows state the load). Counters: grouped
// and dense milliseconds per forward + backward (means), ratio_grouped_over_dense of the means and
// ratio_best of the best iterations, and TFLOP/s (18·T·K·D·F FLOPs per iteration). The
// iteration time is the grouped one. The *_bf16 rows run the op under dtype bfloat16 (bf16
// GEMM operands, fp32 accumulation) against the dense chain in bf16, and add the bf16 GEMM
// roofline measured in the same run (oneDNN bf16 matmul on 2048³) and the grouped op's share of
// it (grouped_of_roofline: means; grouped_best_of_roofline: best iteration).
//
// BM_expert_gemms/*: the per-expert GEMMs alone for one random routing, through gemm_rows (M / K
// as oneDNN runtime dimensions, one primitive per layout), through gemm with the exact row count
// compiled into the primitive (one primitive per count, created before timing: the ideal that
// bucketing approximates, unbounded in primitives), or bucketed to multiples of 16 rows.
//
//   ./build/benchmarks/titan_bench --benchmark_filter=experts
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/cpu.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/gemm.h"

namespace {

using titan::Buffer;
using titan::ops::ExpertsShape;

void fill(Buffer<float>& b, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < b.size(); ++i) b[i] = d(g);
}

std::vector<int32_t> uniform_routing(const ExpertsShape& s, std::mt19937& g) {
  std::vector<int32_t> idx(s.T * s.K), pool(s.E);
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t t = 0; t < s.T; ++t) {
    std::shuffle(pool.begin(), pool.end(), g);
    std::copy_n(pool.begin(), s.K, idx.begin() + t * s.K);
  }
  return idx;
}

// Skewed routing: as uniform_routing, but half the tokens (the even ones) send their first slot
// to expert 0, so expert 0 holds T/2 + about T·(K-1)/(2E) of the T·K routed rows.
std::vector<int32_t> skewed_routing(const ExpertsShape& s, std::mt19937& g) {
  std::vector<int32_t> idx = uniform_routing(s, g);
  for (int64_t t = 0; t < s.T; t += 2) {
    int32_t* row = idx.data() + t * s.K;
    int32_t* zero = std::find(row, row + s.K, 0);
    if (zero != row + s.K)
      std::swap(*zero, row[0]);  // expert 0 already among the K: move it first
    else
      row[0] = 0;  // otherwise it replaces the first choice (the K stay distinct)
  }
  return idx;
}

struct ExpertsData {
  ExpertsShape s;
  Buffer<float> x, w, w1, w3, w2, y, dy, dx, dw, dw1, dw3, dw2, saved, scratch;
  std::vector<int32_t> idx;

  ExpertsData(const ExpertsShape& sh, const titan::ops::GroupedExpertsOp& op, bool skewed) : s(sh) {
    std::mt19937 g(0);
    const int64_t T = s.T, D = s.D, F = s.F, E = s.E, K = s.K;
    x.resize(T * D), w.resize(T * K), y.resize(T * D), dy.resize(T * D), dx.resize(T * D);
    dw.resize(T * K), w1.resize(E * F * D), w3.resize(E * F * D), w2.resize(E * D * F);
    dw1.resize(E * F * D), dw3.resize(E * F * D), dw2.resize(E * D * F);
    saved.resize(op.saved_floats(s)), scratch.resize(op.scratch_floats(s));
    fill(x, g, -1.f, 1.f), fill(dy, g, -1.f, 1.f), fill(w, g, 0.f, 1.f);
    fill(w1, g, -0.05f, 0.05f), fill(w3, g, -0.05f, 0.05f), fill(w2, g, -0.05f, 0.05f);
    idx = skewed ? skewed_routing(s, g) : uniform_routing(s, g);
  }
};

// The dense chain on N = T·K rows with one expert's weights (same FLOPs as the grouped op). In
// bf16 every GEMM takes bf16 operands (the activations rounded in the run, as the op does; the
// weights' bf16 copies made once) with fp32 accumulation.
struct Dense {
  int64_t N, D, F;
  bool bf16;
  Buffer<float> xp, h, g, yp, dyp, dg, dh, dxp, w1, w3, w2, dw1, dw3, dw2;
  Buffer<uint16_t> xpb, gb, dypb, dhb, w1b, w3b, w2b;
  Dense(int64_t n, int64_t d, int64_t f, bool b) : N(n), D(d), F(f), bf16(b) {
    xp.resize(N * D), h.resize(N * 2 * F), g.resize(N * F), yp.resize(N * D), dyp.resize(N * D);
    dg.resize(N * F), dh.resize(N * 2 * F), dxp.resize(N * D);
    w1.resize(F * D), w3.resize(F * D), w2.resize(D * F);
    dw1.resize(F * D), dw3.resize(F * D), dw2.resize(D * F);
    std::mt19937 r(1);
    fill(xp, r, -1.f, 1.f), fill(dyp, r, -1.f, 1.f);
    fill(w1, r, -0.05f, 0.05f), fill(w3, r, -0.05f, 0.05f), fill(w2, r, -0.05f, 0.05f);
    if (bf16) {
      xpb.resize(N * D), gb.resize(N * F), dypb.resize(N * D), dhb.resize(N * 2 * F);
      w1b.resize(F * D), w3b.resize(F * D), w2b.resize(D * F);
      titan::ops::to_bf16(w1.data(), F * D, w1b.data());
      titan::ops::to_bf16(w3.data(), F * D, w3b.data());
      titan::ops::to_bf16(w2.data(), D * F, w2b.data());
    }
  }
  // C = op(A)·op(B) on the fp32 operands, or on their bf16 copies.
  void mm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const uint16_t* ab,
          int64_t lda, const float* b, const uint16_t* bb, int64_t ldb, float* c, int64_t ldc,
          bool acc) {
    if (bf16)
      titan::ops::gemm_bf16(ta, tb, m, n, k, ab, lda, bb, ldb, c, ldc, acc);
    else
      titan::ops::gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc);
  }
  void round(const Buffer<float>& x, Buffer<uint16_t>& y) {
    if (bf16) titan::ops::to_bf16(x.data(), x.size(), y.data());
  }
  void run() {
    round(xp, xpb);
    mm(false, true, N, F, D, xp.data(), xpb.data(), D, w1.data(), w1b.data(), D, h.data(), 2 * F,
       false);
    mm(false, true, N, F, D, xp.data(), xpb.data(), D, w3.data(), w3b.data(), D, h.data() + F,
       2 * F, false);
    titan::ops::swiglu_fwd(h.data(), g.data(), N, F);
    round(g, gb);
    mm(false, true, N, D, F, g.data(), gb.data(), F, w2.data(), w2b.data(), F, yp.data(), D, false);
    round(dyp, dypb);
    mm(false, false, N, F, D, dyp.data(), dypb.data(), D, w2.data(), w2b.data(), F, dg.data(), F,
       false);
    mm(true, false, D, F, N, dyp.data(), dypb.data(), D, g.data(), gb.data(), F, dw2.data(), F,
       true);
    titan::ops::swiglu_bwd(dg.data(), h.data(), dh.data(), N, F);
    round(dh, dhb);
    const uint16_t* dh3 = bf16 ? dhb.data() + F : nullptr;
    mm(false, false, N, D, F, dh.data(), dhb.data(), 2 * F, w1.data(), w1b.data(), D, dxp.data(), D,
       false);
    mm(false, false, N, D, F, dh.data() + F, dh3, 2 * F, w3.data(), w3b.data(), D, dxp.data(), D,
       true);
    mm(true, false, F, D, N, dh.data(), dhb.data(), 2 * F, xp.data(), xpb.data(), D, dw1.data(), D,
       true);
    mm(true, false, F, D, N, dh.data() + F, dh3, 2 * F, xp.data(), xpb.data(), D, dw3.data(), D,
       true);
  }
};

// The bf16 GEMM roofline of this run: oneDNN's bf16 matmul on 2048³ (ops::gemm_probe_flops_bf16),
// measured once, before the first bf16 benchmark.
double bf16_roofline() {
  static const double flops = titan::ops::gemm_probe_flops_bf16();
  return flops;
}

void BM_experts(benchmark::State& state, ExpertsShape s, bool bf16, bool skewed) {
  const titan::ops::GroupedExpertsOp op =
      bf16 ? titan::ops::grouped_experts_bf16_op() : titan::ops::grouped_experts_op();
  const double roofline = bf16 ? bf16_roofline() : 0.0;
  ExpertsData d(s, op, skewed);
  Dense dense(s.T * s.K, s.D, s.F, bf16);
  titan::ops::ExpertsArgs a{s,           d.x.data(),  d.idx.data(),   d.w.data(),      d.w1.data(),
                            d.w3.data(), d.w2.data(), d.saved.data(), d.scratch.data()};
  Buffer<uint16_t> w1b, w3b, w2b;
  if (bf16) {
    w1b.resize(d.w1.size()), w3b.resize(d.w3.size()), w2b.resize(d.w2.size());
    titan::ops::to_bf16(d.w1.data(), d.w1.size(), w1b.data());
    titan::ops::to_bf16(d.w3.data(), d.w3.size(), w3b.data());
    titan::ops::to_bf16(d.w2.data(), d.w2.size(), w2b.data());
    a.w1_bf16 = w1b.data(), a.w3_bf16 = w3b.data(), a.w2_bf16 = w2b.data();
  }
  titan::ops::ExpertsGrads gr{d.dy.data(),  d.dx.data(),  d.dw.data(),
                              d.dw1.data(), d.dw3.data(), d.dw2.data()};
  op.forward(a, d.y.data());  // warm-up: primitives, page faults
  op.backward(a, gr);
  dense.run();
  double grouped_s = 0, dense_s = 0, grouped_min = 1e30, dense_min = 1e30;
  for (auto _ : state) {
    double t0 = titan::cpu::now_seconds();
    op.forward(a, d.y.data());
    op.backward(a, gr);
    double t1 = titan::cpu::now_seconds();
    dense.run();
    double t2 = titan::cpu::now_seconds();
    grouped_s += t1 - t0, dense_s += t2 - t1;
    grouped_min = std::min(grouped_min, t1 - t0), dense_min = std::min(dense_min, t2 - t1);
    state.SetIterationTime(t1 - t0);
  }
  const double it = static_cast<double>(state.iterations());
  const double flops = 18.0 * static_cast<double>(s.T * s.K) * static_cast<double>(s.D * s.F);
  state.counters["grouped_ms"] = grouped_s / it * 1e3;
  state.counters["dense_ms"] = dense_s / it * 1e3;
  state.counters["ratio_grouped_over_dense"] = grouped_s / dense_s;
  // Best iteration of each: robust to other load on the machine (many small GEMMs suffer more
  // from a descheduled thread than a few large ones).
  state.counters["ratio_best"] = grouped_min / dense_min;
  state.counters["grouped_TFLOP/s"] = flops * it / grouped_s / 1e12;
  state.counters["dense_TFLOP/s"] = flops * it / dense_s / 1e12;
  std::vector<int64_t> rows(s.E, 0);
  for (int32_t e : d.idx) ++rows[e];
  state.counters["max_expert_rows"] =
      static_cast<double>(*std::max_element(rows.begin(), rows.end()));
  state.counters["mean_expert_rows"] = static_cast<double>(s.T * s.K) / static_cast<double>(s.E);
  if (bf16) {
    state.counters["roofline_TFLOP/s"] = roofline / 1e12;
    state.counters["grouped_of_roofline"] = flops * it / grouped_s / roofline;
    state.counters["grouped_best_of_roofline"] = flops / grouped_min / roofline;
  }
}

enum class RowsMode { kRuntimeDims, kExactShapes, kBucket16 };

// The 9 per-expert GEMMs of one forward + backward (no SwiGLU, no permutation; each expert has
// its own weights, as in the op), for the row counts of one uniform routing. kRuntimeDims:
// gemm_rows; kExactShapes: gemm with one primitive per row count; kBucket16: gemm on the row
// count rounded up to a multiple of 16 (the rows past it belong to the next expert or to the
// buffers' tail padding; a real bucketing kernel would also need zeroed padding for the weight
// gradients). TFLOP/s counts the useful FLOPs (18·T·K·D·F); new_primitives is how many gemm
// primitives the first pass created.
void BM_expert_gemms(benchmark::State& state, ExpertsShape s, RowsMode mode) {
  std::mt19937 rng(0);
  const std::vector<int32_t> idx = uniform_routing(s, rng);
  std::vector<int64_t> off(s.E + 1, 0);
  for (int32_t e : idx) ++off[e + 1];
  for (int64_t e = 0; e < s.E; ++e) off[e + 1] += off[e];
  const int64_t N = s.T * s.K + 16 * s.E, D = s.D, F = s.F, FD = F * D;
  Buffer<float> xp(N * D), h(N * 2 * F), g(N * F), yp(N * D), dyp(N * D), dg(N * F), dxp(N * D);
  Buffer<float> w1(s.E * FD), w3(s.E * FD), w2(s.E * FD), dw1(s.E * FD), dw3(s.E * FD),
      dw2(s.E * FD);
  fill(xp, rng, -1.f, 1.f), fill(dyp, rng, -1.f, 1.f), fill(h, rng, -1.f, 1.f);
  fill(g, rng, -1.f, 1.f), fill(w1, rng, -0.05f, 0.05f), fill(w3, rng, -0.05f, 0.05f);
  fill(w2, rng, -0.05f, 0.05f);
  auto run = [&]() {
    auto mm = mode == RowsMode::kRuntimeDims ? titan::ops::gemm_rows : titan::ops::gemm;
    for (int64_t e = 0; e < s.E; ++e) {
      const int64_t o = off[e];
      int64_t n = off[e + 1] - o;
      if (n == 0) continue;
      if (mode == RowsMode::kBucket16) n = (n + 15) / 16 * 16;
      const float *W1 = w1.data() + e * FD, *W3 = w3.data() + e * FD, *W2 = w2.data() + e * FD;
      float* he = h.data() + o * 2 * F;
      mm(false, true, n, F, D, xp.data() + o * D, D, W1, D, he, 2 * F, false);
      mm(false, true, n, F, D, xp.data() + o * D, D, W3, D, he + F, 2 * F, false);
      mm(false, true, n, D, F, g.data() + o * F, F, W2, F, yp.data() + o * D, D, false);
      mm(false, false, n, F, D, dyp.data() + o * D, D, W2, F, dg.data() + o * F, F, false);
      mm(true, false, D, F, n, dyp.data() + o * D, D, g.data() + o * F, F, dw2.data() + e * FD, F,
         true);
      mm(false, false, n, D, F, he, 2 * F, W1, D, dxp.data() + o * D, D, false);
      mm(false, false, n, D, F, he + F, 2 * F, W3, D, dxp.data() + o * D, D, true);
      mm(true, false, F, D, n, he, 2 * F, xp.data() + o * D, D, dw1.data() + e * FD, D, true);
      mm(true, false, F, D, n, he + F, 2 * F, xp.data() + o * D, D, dw3.data() + e * FD, D, true);
    }
  };
  const int64_t cached = titan::ops::gemm_cache_size();
  run();  // creates the primitives
  const int64_t created = titan::ops::gemm_cache_size() - cached;
  for (auto _ : state) run();
  state.counters["TFLOP/s"] =
      benchmark::Counter(18.0 * static_cast<double>(s.T * s.K) * static_cast<double>(FD) *
                             static_cast<double>(state.iterations()) / 1e12,
                         benchmark::Counter::kIsRate);
  state.counters["new_primitives"] = static_cast<double>(created);
}

// debugmodel_moe: D=256, F=768, E=64, K=8, 4·256 tokens; reduced Qwen3-30B-A3B expert shape.
const ExpertsShape kDebugMoe{1024, 256, 768, 64, 8};
const ExpertsShape k30B{2048, 2048, 768, 64, 4};

BENCHMARK_CAPTURE(BM_experts, debugmodel_moe, kDebugMoe, false, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_experts, qwen3_30b_a3b_T2048, k30B, false, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_experts, debugmodel_moe_bf16, kDebugMoe, true, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_experts, qwen3_30b_a3b_T2048_bf16, k30B, true, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_experts, qwen3_30b_a3b_T2048_bf16_skewed, k30B, true, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_expert_gemms, debugmodel_moe_runtime_dims, kDebugMoe, RowsMode::kRuntimeDims)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_expert_gemms, debugmodel_moe_exact_shapes, kDebugMoe, RowsMode::kExactShapes)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_expert_gemms, debugmodel_moe_bucket16, kDebugMoe, RowsMode::kBucket16)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_expert_gemms, qwen3_30b_a3b_T2048_runtime_dims, k30B, RowsMode::kRuntimeDims)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_expert_gemms, qwen3_30b_a3b_T2048_exact_shapes, k30B, RowsMode::kExactShapes)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_expert_gemms, qwen3_30b_a3b_T2048_bucket16, k30B, RowsMode::kBucket16)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();

}  // namespace
