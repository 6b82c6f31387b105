// The grouped-experts kernel pairs (ops/experts_op.h) against a double-precision reference of
//   y[t] = Σ_j w[t,j] · W2[e] · ( silu(W1[e]·x[t]) ⊙ W3[e]·x[t] ),  e = idx[t,j],
// written here independently of both kernels.
//
//  * Forward of "grouped_experts" and "grouped_experts_reference" against that double reference.
//  * Backward of both for L = Σ r ⊙ y (dy = r): every element of dx, dw, dw1, dw3, dw2 against
//    central finite differences of the double reference on a tiny shape (eps = 1e-5; the
//    truncation error is ~1e-10, far below the tolerance).
//  * grouped against reference, forward and backward, on shapes with odd sizes, experts that get
//    no tokens (E > T·K, routing to a subset), all tokens on one expert, K = 1, T = 1, T = 0,
//    and idx duplicate-free per token.
//  * Determinism (bitwise-equal on repeat, whatever the scratch holds), the gradient contract
//    (dx, dw written; dw1, dw3, dw2 accumulated; zero-token experts untouched), buffer sizes
//    non-decreasing in T, out-of-range expert ids rejected, and a bounded GEMM primitive cache
//    across routings (the token count per expert changes every step).
//
// Tolerances: 1e-4 relative plus 1e-4 of the tensor's largest magnitude. The grouped kernel sums
// in fp32 (oneDNN GEMMs over D, F and, for the weight gradients, up to T·K tokens, plus the
// slot-order combine), which is ~1e-6 relative at these sizes; the reference kernel accumulates
// in double and only rounds its outputs (~6e-8). Weights are scaled by 1/sqrt(fan-in) so that
// activations are O(1) at every size.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference_util.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/gemm.h"

namespace titan::ops {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

constexpr double kRtol = 1e-4, kAtol = 1e-4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class Routing {
  kRandom,   // K distinct experts per token, uniform
  kSubset,   // K distinct experts among the even-numbered ones (odd experts get no tokens)
  kSameSet,  // every token to experts {1, ..., K} (all tokens on one expert when K = 1)
};

struct Case {
  const char* name;
  ExpertsShape s;
  Routing routing;
};

struct Problem {
  ExpertsShape s;
  std::vector<float> x, w, w1, w3, w2, dy;
  std::vector<int32_t> idx;
};

std::vector<int32_t> make_idx(const ExpertsShape& s, Routing r, std::mt19937& g) {
  std::vector<int32_t> idx(s.T * s.K);
  std::vector<int32_t> pool;
  for (int32_t e = 0; e < s.E; ++e)
    if (r != Routing::kSubset || e % 2 == 0) pool.push_back(e);
  for (int64_t t = 0; t < s.T; ++t) {
    if (r == Routing::kSameSet) {
      for (int64_t j = 0; j < s.K; ++j) idx[t * s.K + j] = static_cast<int32_t>(1 + j);
      continue;
    }
    std::shuffle(pool.begin(), pool.end(), g);  // the first K of a permutation: distinct
    for (int64_t j = 0; j < s.K; ++j) idx[t * s.K + j] = pool[j];
  }
  return idx;
}

Problem make_problem(const ExpertsShape& s, Routing r, uint32_t seed) {
  Problem p;
  p.s = s;
  std::mt19937 g(seed);
  const float a1 = 1.5f / std::sqrt(static_cast<float>(s.D));
  const float a2 = 1.5f / std::sqrt(static_cast<float>(s.F));
  p.x = uniform(s.T * s.D, g, -1.f, 1.f);
  p.w = uniform(s.T * s.K, g, 0.05f, 1.f);
  p.w1 = uniform(s.E * s.F * s.D, g, -a1, a1);
  p.w3 = uniform(s.E * s.F * s.D, g, -a1, a1);
  p.w2 = uniform(s.E * s.D * s.F, g, -a2, a2);
  p.dy = uniform(s.T * s.D, g, -1.f, 1.f);
  p.idx = make_idx(s, r, g);
  return p;
}

// ---- The double reference, over double copies of the inputs (finite differences perturb them).
struct DParams {
  std::vector<double> x, w, w1, w3, w2;
};

DParams to_double(const Problem& p) {
  using kernel_test::to_double;
  return {to_double(p.x), to_double(p.w), to_double(p.w1), to_double(p.w3), to_double(p.w2)};
}

std::vector<double> ref_forward(const ExpertsShape& s, const std::vector<int32_t>& idx,
                                const DParams& q) {
  const int64_t D = s.D, F = s.F, K = s.K;
  std::vector<double> y(s.T * D, 0.0), g(F);
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = idx[t * K + j];
      for (int64_t f = 0; f < F; ++f) {
        double a = 0, b = 0;
        for (int64_t d = 0; d < D; ++d) {
          a += q.w1[(e * F + f) * D + d] * q.x[t * D + d];
          b += q.w3[(e * F + f) * D + d] * q.x[t * D + d];
        }
        g[f] = a / (1.0 + std::exp(-a)) * b;
      }
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t f = 0; f < F; ++f) o += q.w2[(e * D + d) * F + f] * g[f];
        y[t * D + d] += q.w[t * K + j] * o;
      }
    }
  return y;
}

// ---- Running an op.
struct Outputs {
  std::vector<float> y, dx, dw, dw1, dw3, dw2;
};

// Forward then backward of `op` on p. Scratch starts as NaN (a kernel that read scratch it did
// not write would poison its outputs), so do y, dx and dw (they must be written). dw1, dw3, dw2
// start at `grad0` (default zero) and are accumulated into.
Outputs run_op(const GroupedExpertsOp& op, const Problem& p, const Outputs* grad0 = nullptr) {
  const ExpertsShape& s = p.s;
  std::vector<float> saved(static_cast<size_t>(op.saved_floats(s)) + 1, kNaN);
  std::vector<float> scratch(static_cast<size_t>(op.scratch_floats(s)) + 1, kNaN);
  ExpertsArgs a{s,           p.x.data(),  p.idx.data(), p.w.data(),    p.w1.data(),
                p.w3.data(), p.w2.data(), saved.data(), scratch.data()};
  std::vector<uint16_t> b1(p.w1.size()), b3(p.w3.size()), b2(p.w2.size());  // bf16 copies
  if (op.dtype == "bfloat16") {
    f32_to(DType::BF16, p.w1.data(), static_cast<int64_t>(b1.size()), b1.data());
    f32_to(DType::BF16, p.w3.data(), static_cast<int64_t>(b3.size()), b3.data());
    f32_to(DType::BF16, p.w2.data(), static_cast<int64_t>(b2.size()), b2.data());
    a.w1_bf16 = b1.data(), a.w3_bf16 = b3.data(), a.w2_bf16 = b2.data();
  }
  Outputs o;
  o.y.assign(s.T * s.D, kNaN);
  o.dx.assign(s.T * s.D, kNaN);
  o.dw.assign(s.T * s.K, kNaN);
  if (grad0) {
    o.dw1 = grad0->dw1, o.dw3 = grad0->dw3, o.dw2 = grad0->dw2;
  } else {
    o.dw1.assign(p.w1.size(), 0.f), o.dw3.assign(p.w3.size(), 0.f);
    o.dw2.assign(p.w2.size(), 0.f);
  }
  if (op.check) op.check(s);
  op.forward(a, o.y.data());
  std::fill(scratch.begin(), scratch.end(), kNaN);  // the backward may not rely on it either
  ExpertsGrads gr{p.dy.data(), o.dx.data(), o.dw.data(), o.dw1.data(), o.dw3.data(), o.dw2.data()};
  op.backward(a, gr);
  return o;
}

std::vector<GroupedExpertsOp> both_ops() {
  return {grouped_experts_op(), grouped_experts_reference_op()};
}

// The bf16 op (bf16 GEMM operands, fp32 accumulation) against the double reference (forward)
// and the fp32 op (backward; itself held to 1e-4 of the double reference and finite differences
// above), at the bf16 level: each GEMM operand carries a relative rounding error of at most
// u = 2^-8, so outputs are off by about u·(a few) of their scale; 1e-2 of the tensor's scale.
TEST(ExpertsOpTest, Bf16OpMatchesReferenceToBf16Rounding) {
  const ExpertsShape s{37, 24, 20, 6, 2};
  const Problem p = make_problem(s, Routing::kRandom, 77);
  const GroupedExpertsOp op = grouped_experts_bf16_op();
  EXPECT_EQ(op.name, "grouped_experts");
  EXPECT_EQ(op.dtype, "bfloat16");
  const Outputs b = run_op(op, p), f = run_op(grouped_experts_op(), p);
  const double y_err =
      expect_close("y bf16 vs double", b.y, ref_forward(s, p.idx, to_double(p)), 0, 1e-2);
  auto vs_fp32 = [](const std::string& what, const std::vector<float>& got,
                    const std::vector<float>& want) {
    return expect_close(what, got, kernel_test::to_double(want), 0, 1e-2);
  };
  const double dx = vs_fp32("dx", b.dx, f.dx), dw = vs_fp32("dw", b.dw, f.dw),
               dw1 = vs_fp32("dw1", b.dw1, f.dw1), dw3 = vs_fp32("dw3", b.dw3, f.dw3),
               dw2 = vs_fp32("dw2", b.dw2, f.dw2);
  EXPECT_GT(y_err, 0);  // really bf16: the rounding shows
  std::printf("bf16 experts, error / scale: y %.2e dx %.2e dw %.2e dw1 %.2e dw3 %.2e dw2 %.2e\n",
              y_err, dx, dw, dw1, dw3, dw2);
}

TEST(ExpertsOpTest, NamesAndRegistryFields) {
  GroupedExpertsOp g = grouped_experts_op(), r = grouped_experts_reference_op();
  EXPECT_EQ(g.name, "grouped_experts");
  EXPECT_EQ(r.name, "grouped_experts_reference");
  for (const auto& op : {g, r}) {
    EXPECT_EQ(op.device, "cpu");
    EXPECT_EQ(op.dtype, "float32");
    EXPECT_TRUE(op.saved_floats && op.scratch_floats && op.forward && op.backward);
  }
}

// Forward of both ops against the double reference.
TEST(ExpertsOpTest, ForwardMatchesDoubleReference) {
  const ExpertsShape s{/*T=*/19, /*D=*/24, /*F=*/20, /*E=*/8, /*K=*/3};
  const Problem p = make_problem(s, Routing::kRandom, 1);
  const std::vector<double> want = ref_forward(s, p.idx, to_double(p));
  for (const auto& op : both_ops()) {
    SCOPED_TRACE(op.name);
    expect_close(op.name + " y", run_op(op, p).y, want, kRtol, kAtol);
  }
}

// Backward of both ops, every gradient element, against central finite differences of
// L = Σ dy ⊙ y(reference) on a tiny shape (E = 5 with K = 2 distinct experts per token; expert 4
// gets no token, so its weight gradients must be exactly zero).
TEST(ExpertsOpTest, BackwardMatchesFiniteDifferences) {
  const ExpertsShape s{/*T=*/5, /*D=*/6, /*F=*/4, /*E=*/5, /*K=*/2};
  Problem p = make_problem(s, Routing::kRandom, 2);
  for (int32_t& e : p.idx)
    if (e == 4) e = 0;
  for (int64_t t = 0; t < s.T; ++t)  // keep the two experts of a token distinct
    if (p.idx[t * 2] == p.idx[t * 2 + 1]) p.idx[t * 2 + 1] = p.idx[t * 2] == 3 ? 1 : 3;
  DParams q = to_double(p);
  auto loss = [&]() {
    const std::vector<double> y = ref_forward(s, p.idx, q);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(p.dy[i]) * y[i];
    return l;
  };
  auto fd = [&](std::vector<double>& v) {
    return kernel_test::finite_diff(v, kernel_test::iota_idx(static_cast<int64_t>(v.size())), loss);
  };
  const std::vector<double> gx = fd(q.x), gw = fd(q.w), g1 = fd(q.w1), g3 = fd(q.w3), g2 = fd(q.w2);
  for (const auto& op : both_ops()) {
    SCOPED_TRACE(op.name);
    const Outputs o = run_op(op, p);
    expect_close(op.name + " dx", o.dx, gx, kRtol, kAtol);
    expect_close(op.name + " dw", o.dw, gw, kRtol, kAtol);
    expect_close(op.name + " dw1", o.dw1, g1, kRtol, kAtol);
    expect_close(op.name + " dw3", o.dw3, g3, kRtol, kAtol);
    expect_close(op.name + " dw2", o.dw2, g2, kRtol, kAtol);
    for (int64_t i = 4 * s.F * s.D; i < 5 * s.F * s.D; ++i) {
      ASSERT_EQ(o.dw1[i], 0.f) << "expert 4 got no token";
      ASSERT_EQ(o.dw3[i], 0.f);
      ASSERT_EQ(o.dw2[i], 0.f);
    }
  }
}

class ExpertsShapesTest : public ::testing::TestWithParam<Case> {};

// grouped against reference, forward and backward, plus the forward against the double
// reference (so a bug shared by both kernels would still show).
TEST_P(ExpertsShapesTest, GroupedMatchesReference) {
  const Case& c = GetParam();
  const Problem p = make_problem(c.s, c.routing, 3);
  const Outputs g = run_op(grouped_experts_op(), p);
  const Outputs r = run_op(grouped_experts_reference_op(), p);
  auto d = [](const std::vector<float>& v) { return kernel_test::to_double(v); };
  expect_close("y vs double", g.y, ref_forward(c.s, p.idx, to_double(p)), kRtol, kAtol);
  if (c.s.T == 0) return;  // nothing else to compare (and expect_close needs a scale)
  expect_close("y", g.y, d(r.y), kRtol, kAtol);
  expect_close("dx", g.dx, d(r.dx), kRtol, kAtol);
  expect_close("dw", g.dw, d(r.dw), kRtol, kAtol);
  expect_close("dw1", g.dw1, d(r.dw1), kRtol, kAtol);
  expect_close("dw3", g.dw3, d(r.dw3), kRtol, kAtol);
  expect_close("dw2", g.dw2, d(r.dw2), kRtol, kAtol);
  // Experts without tokens get exactly zero gradient from both.
  std::vector<bool> used(c.s.E, false);
  for (int32_t e : p.idx) used[e] = true;
  const int64_t FD = c.s.F * c.s.D;
  for (int64_t e = 0; e < c.s.E; ++e) {
    if (used[e]) continue;
    for (int64_t i = e * FD; i < (e + 1) * FD; ++i) {
      ASSERT_EQ(g.dw1[i], 0.f) << "expert " << e;
      ASSERT_EQ(g.dw3[i], 0.f) << "expert " << e;
      ASSERT_EQ(g.dw2[i], 0.f) << "expert " << e;
      ASSERT_EQ(r.dw1[i], 0.f) << "expert " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ExpertsShapes, ExpertsShapesTest,
    ::testing::Values(Case{"random", {32, 24, 20, 8, 2}, Routing::kRandom},
                      Case{"odd_sizes_K3", {13, 17, 9, 7, 3}, Routing::kRandom},
                      Case{"K1", {21, 16, 12, 6, 1}, Routing::kRandom},
                      Case{"T1", {1, 8, 12, 5, 3}, Routing::kRandom},
                      Case{"T1_K1", {1, 5, 3, 1, 1}, Routing::kRandom},
                      Case{"E_exceeds_pairs", {6, 16, 8, 64, 4}, Routing::kRandom},
                      Case{"half_the_experts_idle", {24, 12, 10, 10, 3}, Routing::kSubset},
                      Case{"all_tokens_one_expert", {40, 16, 12, 6, 1}, Routing::kSameSet},
                      Case{"all_tokens_same_set", {9, 8, 8, 5, 4}, Routing::kSameSet},
                      Case{"wide", {64, 64, 48, 16, 4}, Routing::kRandom},
                      // 1,100 rows on each of two experts: each split into 3 work items
                      Case{"hot_experts_split", {1100, 40, 36, 4, 2}, Routing::kSameSet},
                      Case{"T0", {0, 8, 8, 4, 2}, Routing::kRandom}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Two runs of the grouped op give bitwise-identical outputs (fixed permutation, slot-order
// sums, no atomics), even with other data left in scratch in between.
TEST(ExpertsOpTest, GroupedIsDeterministic) {
  const ExpertsShape s{48, 32, 24, 12, 4};
  const Problem p = make_problem(s, Routing::kRandom, 4);
  const GroupedExpertsOp op = grouped_experts_op();
  const Outputs a = run_op(op, p);
  run_op(op, make_problem(s, Routing::kRandom, 5));  // different routing in between
  const Outputs b = run_op(op, p);
  auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(a.y, b.y));
  EXPECT_TRUE(same(a.dx, b.dx));
  EXPECT_TRUE(same(a.dw, b.dw));
  EXPECT_TRUE(same(a.dw1, b.dw1));
  EXPECT_TRUE(same(a.dw3, b.dw3));
  EXPECT_TRUE(same(a.dw2, b.dw2));
}

// The GEMMs run as work items spread over the threads; the items depend on the routing alone, so
// the results are bitwise the same on one thread as on all (a hot expert split into items too).
TEST(ExpertsOpTest, GroupedDoesNotDependOnThreadCount) {
  const int threads = omp_get_max_threads();
  for (const Routing r : {Routing::kRandom, Routing::kSameSet}) {
    const Problem p = make_problem({1100, 24, 20, 6, 2}, r, 8);
    for (const auto& op : {grouped_experts_op(), grouped_experts_bf16_op()}) {
      SCOPED_TRACE(op.name + " " + op.dtype);
      const Outputs a = run_op(op, p);
      omp_set_num_threads(1);
      const Outputs b = run_op(op, p);
      omp_set_num_threads(threads);
      EXPECT_EQ(a.y, b.y);
      EXPECT_EQ(a.dx, b.dx);
      EXPECT_EQ(a.dw, b.dw);
      EXPECT_EQ(a.dw1, b.dw1);
      EXPECT_EQ(a.dw3, b.dw3);
      EXPECT_EQ(a.dw2, b.dw2);
    }
  }
}

// dw1, dw3, dw2 are accumulated (+=) onto what they held; dx and dw are written (run_op starts
// them as NaN, so an accumulating kernel would give NaN).
TEST(ExpertsOpTest, WeightGradientsAccumulateInputGradientsAreWritten) {
  const ExpertsShape s{16, 12, 10, 6, 2};
  const Problem p = make_problem(s, Routing::kSubset, 6);
  std::mt19937 g(7);
  Outputs g0;
  g0.dw1 = uniform(s.E * s.F * s.D, g, -1.f, 1.f);
  g0.dw3 = uniform(s.E * s.F * s.D, g, -1.f, 1.f);
  g0.dw2 = uniform(s.E * s.D * s.F, g, -1.f, 1.f);
  for (const auto& op : both_ops()) {
    SCOPED_TRACE(op.name);
    const Outputs fresh = run_op(op, p);
    const Outputs acc = run_op(op, p, &g0);
    auto sum = [](const std::vector<float>& a, const std::vector<float>& b) {
      std::vector<double> r(a.size());
      for (size_t i = 0; i < a.size(); ++i) r[i] = static_cast<double>(a[i]) + b[i];
      return r;
    };
    // One fp32 rounding of the sum (the kernel adds onto the old value once, or in GEMM order).
    expect_close("dw1 accumulated", acc.dw1, sum(g0.dw1, fresh.dw1), 1e-6, 1e-6);
    expect_close("dw3 accumulated", acc.dw3, sum(g0.dw3, fresh.dw3), 1e-6, 1e-6);
    expect_close("dw2 accumulated", acc.dw2, sum(g0.dw2, fresh.dw2), 1e-6, 1e-6);
    EXPECT_EQ(acc.dx, fresh.dx);
    EXPECT_EQ(acc.dw, fresh.dw);
    // Odd experts got no token (Routing::kSubset): their accumulators are untouched.
    const int64_t FD = s.F * s.D;
    for (int64_t i = FD; i < 2 * FD; ++i) {
      ASSERT_EQ(acc.dw1[i], g0.dw1[i]);
      ASSERT_EQ(acc.dw3[i], g0.dw3[i]);
      ASSERT_EQ(acc.dw2[i], g0.dw2[i]);
    }
  }
}

TEST(ExpertsOpTest, BufferSizesNonDecreasingInT) {
  for (const auto& op : both_ops())
    for (const ExpertsShape base :
         {ExpertsShape{0, 256, 768, 64, 8}, ExpertsShape{0, 7, 5, 3, 2}}) {
      int64_t prev_saved = -1, prev_scratch = -1;
      for (int64_t T = 0; T <= 300; ++T) {
        ExpertsShape s = base;
        s.T = T;
        const int64_t sv = op.saved_floats(s), sc = op.scratch_floats(s);
        EXPECT_GE(sv, prev_saved) << op.name << " T=" << T;
        EXPECT_GE(sc, prev_scratch) << op.name << " T=" << T;
        EXPECT_GE(sv, 0);
        EXPECT_GE(sc, 0);
        prev_saved = sv, prev_scratch = sc;
      }
    }
}

TEST(ExpertsOpTest, RejectsOutOfRangeExpertIds) {
  const ExpertsShape s{4, 8, 6, 3, 2};
  for (int32_t bad : {-1, 3}) {
    Problem p = make_problem(s, Routing::kRandom, 8);
    p.idx[5] = bad;
    for (const auto& op : both_ops()) {
      std::vector<float> saved(op.saved_floats(s) + 1), scratch(op.scratch_floats(s) + 1);
      std::vector<float> y(s.T * s.D);
      ExpertsArgs a{s,           p.x.data(),  p.idx.data(), p.w.data(),    p.w1.data(),
                    p.w3.data(), p.w2.data(), saved.data(), scratch.data()};
      EXPECT_THROW(op.forward(a, y.data()), titan::Error) << op.name << " id " << bad;
    }
  }
}

// The number of tokens per expert changes with every routing; the grouped op's GEMMs must not
// create a primitive per count (gemm_rows keeps M and K as runtime dimensions).
// The op runs its GEMMs on every thread, each thread with its own primitive cache: on one thread
// the cache holds one primitive per layout whatever the routing; on all threads, at most that
// many per thread.
TEST(ExpertsOpTest, GemmCacheBoundedAcrossRoutings) {
  const ExpertsShape s{40, 24, 16, 8, 2};
  const GroupedExpertsOp op = grouped_experts_op();
  const int threads = omp_get_max_threads();
  const int64_t before = gemm_cache_size();
  omp_set_num_threads(1);
  run_op(op, make_problem(s, Routing::kRandom, 100));
  const int64_t cached = gemm_cache_size();
  for (uint32_t seed = 101; seed < 112; ++seed) {
    const Routing r =
        seed % 3 == 0 ? Routing::kSameSet : (seed % 3 == 1 ? Routing::kSubset : Routing::kRandom);
    run_op(op, make_problem(s, r, seed));
    EXPECT_EQ(gemm_cache_size(), cached) << "routing seed " << seed;
  }
  // A smaller microbatch (fewer tokens, same model) reuses the same primitives too.
  ExpertsShape small = s;
  small.T = 7;
  run_op(op, make_problem(small, Routing::kRandom, 120));
  EXPECT_EQ(gemm_cache_size(), cached);
  omp_set_num_threads(threads);
  for (uint32_t seed = 130; seed < 136; ++seed) run_op(op, make_problem(s, Routing::kRandom, seed));
  EXPECT_LE(gemm_cache_size() - before, (cached - before) * threads);
}

}  // namespace
}  // namespace titan::ops
