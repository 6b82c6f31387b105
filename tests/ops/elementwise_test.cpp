// Row-wise kernels (embedding, RMSNorm, RoPE, SwiGLU, add) against naive double-precision
// references written from the math in elementwise.h (HF Qwen3 semantics). Backward kernels are
// checked against central finite differences of the double reference of the scalar objective
// L = Σ r ⊙ out for a fixed random r, so that dL/dinput is what backward(r) must return.
//
// Tolerances: the kernels run in fp32 and the references in double, so each element is allowed
// 1e-4 relative error plus 1e-4 of the tensor's largest magnitude (fp32 rounding over rows of
// ≤ 64 terms is ~1e-6; the finite differences are exact to ~1e-10 at eps = 1e-5).
#include "titan/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "reference_util.h"
#include "titan/core/error.h"

namespace titan::ops {
namespace {

using kernel_test::expect_close;
using kernel_test::finite_diff;
using kernel_test::iota_idx;
using kernel_test::scatter;
using kernel_test::to_double;
using kernel_test::uniform;

constexpr double kRtol = 1e-4, kAtol = 1e-4;

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingTest, ForwardCopiesRows) {
  const int64_t V = 11, D = 13, T = 17;
  std::mt19937 g(1);
  auto table = uniform(V * D, g, -1.f, 1.f);
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 7 + 3) % V);
  ids[0] = 0;
  ids[T - 1] = static_cast<int32_t>(V - 1);
  std::vector<float> out(T * D, -1.f);
  embedding_fwd(ids.data(), T, table.data(), V, D, out.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) ASSERT_EQ(out[t * D + c], table[ids[t] * D + c]);
}

// The vocabulary shard [v0, v0 + vl): the rows of ids in it (zeros for the others); the backward
// adds to those rows alone, the same sums as the whole table's backward restricted to them.
TEST(EmbeddingTest, RangeFormsAreTheWholeTablesRestricted) {
  const int64_t V = 11, D = 13, T = 40, v0 = 3, vl = 5;
  std::mt19937 g(3);
  const auto table = uniform(V * D, g, -1.f, 1.f), dout = uniform(T * D, g, -1.f, 1.f);
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 7 + 3) % V);
  std::vector<float> whole(T * D), part(T * D, -1.f);
  embedding_fwd(ids.data(), T, table.data(), V, D, whole.data());
  embedding_fwd_range(ids.data(), T, table.data() + v0 * D, V, v0, vl, D, part.data());
  for (int64_t t = 0; t < T; ++t) {
    const bool mine = ids[t] >= v0 && ids[t] < v0 + vl;
    for (int64_t c = 0; c < D; ++c) ASSERT_EQ(part[t * D + c], mine ? whole[t * D + c] : 0.f);
  }
  std::vector<float> dwhole(V * D, 0.f), dpart(vl * D, 0.f);
  embedding_bwd(ids.data(), T, dout.data(), D, dwhole.data());
  embedding_bwd_range(ids.data(), T, dout.data(), v0, vl, D, dpart.data());
  EXPECT_EQ(dpart, std::vector<float>(dwhole.begin() + v0 * D, dwhole.begin() + (v0 + vl) * D));
  std::vector<int32_t> bad = ids;
  bad[5] = static_cast<int32_t>(V);
  EXPECT_THROW(embedding_fwd_range(bad.data(), T, table.data(), V, v0, vl, D, part.data()), Error);
}

// dtable[ids[t]] += dout[t]: repeated ids sum, untouched rows keep their previous value.
TEST(EmbeddingTest, BackwardAccumulatesFiniteDifferenceGradient) {
  const int64_t V = 11, D = 13, T = 17;
  std::mt19937 g(2);
  auto table = uniform(V * D, g, -1.f, 1.f);
  auto r = uniform(T * D, g, -1.f, 1.f);
  auto dtable0 = uniform(V * D, g, -1.f, 1.f);
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t)
    ids[t] = static_cast<int32_t>((t * t + 1) % (V - 2));  // rows V-2, V-1 unused

  std::vector<float> dtable = dtable0;
  embedding_bwd(ids.data(), T, r.data(), D, dtable.data());

  auto tab = to_double(table);
  auto L = [&] {
    double s = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) s += r[t * D + c] * tab[ids[t] * D + c];
    return s;
  };
  auto fd = finite_diff(tab, iota_idx(V * D), L);
  std::vector<double> want(V * D);
  for (int64_t i = 0; i < V * D; ++i) want[i] = dtable0[i] + fd[i];
  expect_close("dtable", dtable, want, kRtol, kAtol);
}

TEST(EmbeddingTest, OutOfRangeIdThrows) {
  const int64_t V = 5, D = 3;
  std::vector<float> table(V * D, 1.f), out(2 * D);
  for (int32_t bad : {-1, 5, 1000}) {
    std::vector<int32_t> ids = {1, bad};
    EXPECT_THROW(embedding_fwd(ids.data(), 2, table.data(), V, D, out.data()), titan::Error)
        << "id " << bad;
  }
  std::vector<int32_t> ok = {0, 4};
  EXPECT_NO_THROW(embedding_fwd(ok.data(), 2, table.data(), V, D, out.data()));
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

// y = w ⊙ x·rstd, rstd = 1/sqrt(mean(x²) + eps) on every (t, h) row; y and rstd in double.
void ref_rmsnorm(const NormRows& s, const std::vector<double>& x, const std::vector<double>& w,
                 double eps, std::vector<double>& y, std::vector<double>& rstd) {
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const double* xr = x.data() + t * s.ldx + h * s.N;
      double ss = 0;
      for (int64_t i = 0; i < s.N; ++i) ss += xr[i] * xr[i];
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(s.N) + eps);
      rstd[t * s.H + h] = rs;
      for (int64_t i = 0; i < s.N; ++i) y[t * s.ldy + h * s.N + i] = w[i] * xr[i] * rs;
    }
}

// Indices of the row elements (not the padding) in a buffer with T tokens of stride ld.
std::vector<int64_t> row_elements(const NormRows& s, int64_t ld) {
  std::vector<int64_t> idx;
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < s.H * s.N; ++j) idx.push_back(t * ld + j);
  return idx;
}

void check_rmsnorm(const NormRows& s, float eps, uint32_t seed) {
  std::mt19937 g(seed);
  const float sentinel = 777.f;
  std::vector<float> x(s.T * s.ldx, sentinel), dy(s.T * s.ldy, sentinel);
  auto xv = uniform(s.T * s.ldx, g, -1.f, 1.f), rv = uniform(s.T * s.ldy, g, -1.f, 1.f);
  const auto xi = row_elements(s, s.ldx), yi = row_elements(s, s.ldy);
  for (int64_t i : xi) x[i] = xv[i];
  for (int64_t i : yi) dy[i] = rv[i];
  // One row of small magnitude, where eps is a visible part of the denominator.
  for (int64_t j = 0; j < s.N; ++j) x[s.ldx + j] *= 0.01f;
  auto w = uniform(s.N, g, 0.5f, 1.5f);
  auto dw0 = uniform(s.N, g, -1.f, 1.f);

  // Forward.
  std::vector<float> y(s.T * s.ldy, sentinel), rstd(s.T * s.H);
  rmsnorm_fwd(s, x.data(), w.data(), eps, y.data(), rstd.data());
  auto xd = to_double(x), wd = to_double(w);
  std::vector<double> yref(s.T * s.ldy, sentinel), rref(s.T * s.H);
  ref_rmsnorm(s, xd, wd, eps, yref, rref);
  expect_close("y", y.data(), yref.data(), yi, kRtol, kAtol);
  expect_close("rstd", rstd, rref, kRtol, kAtol);
  for (int64_t i = 0; i < s.T * s.ldy; ++i)
    if (i % s.ldy >= s.H * s.N) {
      ASSERT_EQ(y[i], sentinel) << "rmsnorm_fwd wrote y padding " << i;
    }

  // Backward with dy = r: dx written (layout of x), dw accumulated.
  std::vector<float> dx(s.T * s.ldx, sentinel), dw = dw0;
  std::vector<float> scratch(rmsnorm_bwd_scratch(s));
  rmsnorm_bwd(s, dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), scratch.data());
  std::vector<double> ytmp(s.T * s.ldy), rtmp(s.T * s.H);
  auto L = [&] {
    ref_rmsnorm(s, xd, wd, eps, ytmp, rtmp);
    double sum = 0;
    for (int64_t i : yi) sum += dy[i] * ytmp[i];
    return sum;
  };
  auto dx_fd = scatter(s.T * s.ldx, xi, finite_diff(xd, xi, L));
  expect_close("dx", dx.data(), dx_fd.data(), xi, kRtol, kAtol);
  for (int64_t i = 0; i < s.T * s.ldx; ++i)
    if (i % s.ldx >= s.H * s.N) {
      ASSERT_EQ(dx[i], sentinel) << "rmsnorm_bwd wrote dx padding " << i;
    }
  auto dw_fd = finite_diff(wd, iota_idx(s.N), L);
  for (int64_t i = 0; i < s.N; ++i) dw_fd[i] += dw0[i];
  expect_close("dw", dw, dw_fd, kRtol, kAtol);
}

// Ordinary [T, N] norm (H = 1, ld = N); N = 37 covers the 16-wide blocks and the tail.
TEST(RmsNormTest, PlainRowsForwardBackward) { check_rmsnorm({6, 1, 37, 37, 37}, 1e-6f, 3); }

// Hidden-size rows, more rows than the 32 dw reduction blocks.
TEST(RmsNormTest, ManyRowsForwardBackward) { check_rmsnorm({40, 1, 64, 64, 64}, 1e-6f, 4); }

// Per-head q_norm/k_norm layout: heads of N = d inside a wider token row (ldx != H·N, as in the
// fused qkv buffer), output rows with another stride, 39 rows (> 32 blocks), larger eps.
TEST(RmsNormTest, PerHeadStridedForwardBackward) { check_rmsnorm({13, 3, 20, 100, 67}, 1e-2f, 5); }

TEST(RmsNormTest, PerHeadContiguousOutput) { check_rmsnorm({5, 4, 16, 96, 64}, 1e-6f, 6); }

// ---------------------------------------------------------------------------------------------
// RoPE

// HF rotate_half on pairs (j, j + d/2), angle pos·θ^(-2j/d), in double.
void ref_rope(std::vector<double>& x, int64_t T, int64_t H, int64_t d, int64_t ldx,
              const std::vector<int32_t>& pos, double theta) {
  const int64_t half = d / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < half; ++j) {
        const double a = pos[t] * std::pow(theta, -2.0 * j / static_cast<double>(d));
        double& x1 = x[t * ldx + h * d + j];
        double& x2 = x[t * ldx + h * d + j + half];
        const double y1 = x1 * std::cos(a) - x2 * std::sin(a);
        const double y2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = y1;
        x2 = y2;
      }
}

// The table is built as HF does in fp32 (inv_freq and pos·inv_freq in float), so the angle
// carries fp32 rounding: |Δangle| ≲ 2 ulp(max_pos) ≈ 2e-5 for positions < 130; 1e-4 abs.
TEST(RopeTest, TableMatchesDoubleAngles) {
  for (int64_t d : {16, 128}) {
    const int64_t max_pos = 130;
    const double theta = 1e6;
    std::vector<float> cs(max_pos * d);
    rope_table(max_pos, d, theta, cs.data());
    double max_err = 0;
    for (int64_t p = 0; p < max_pos; ++p)
      for (int64_t j = 0; j < d / 2; ++j) {
        const double a = p * std::pow(theta, -2.0 * j / static_cast<double>(d));
        max_err = std::max(max_err, std::abs(cs[p * d + j] - std::cos(a)));
        max_err = std::max(max_err, std::abs(cs[p * d + d / 2 + j] - std::sin(a)));
      }
    EXPECT_LT(max_err, 1e-4) << "d = " << d;
    ::testing::Test::RecordProperty("max_abs_err d=" + std::to_string(d),
                                    kernel_test::sci(max_err));
  }
}

void check_rope(int64_t T, int64_t H, int64_t d, int64_t ldx, uint32_t seed) {
  const int64_t max_pos = 100;
  const double theta = 10000.0;
  std::mt19937 g(seed);
  std::vector<float> cs(max_pos * d);
  rope_table(max_pos, d, theta, cs.data());
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(g() % max_pos);
  pos[0] = 0;
  pos[T - 1] = static_cast<int32_t>(max_pos - 1);
  const float sentinel = 777.f;
  std::vector<float> x(T * ldx, sentinel), r(T * ldx, sentinel);
  auto xv = uniform(T * ldx, g, -1.f, 1.f), rv = uniform(T * ldx, g, -1.f, 1.f);
  NormRows lay{T, H, d, ldx, ldx};
  const auto xi = row_elements(lay, ldx);
  for (int64_t i : xi) x[i] = xv[i], r[i] = rv[i];

  std::vector<float> y = x;
  rope_fwd(y.data(), T, H, d, ldx, pos.data(), cs.data());
  auto yref = to_double(x);
  ref_rope(yref, T, H, d, ldx, pos, theta);
  expect_close("rope y", y.data(), yref.data(), xi, kRtol, kAtol);
  for (int64_t i = 0; i < T * ldx; ++i)
    if (i % ldx >= H * d) {
      ASSERT_EQ(y[i], sentinel) << "rope_fwd wrote padding " << i;
    }

  std::vector<float> dx = r;
  rope_bwd(dx.data(), T, H, d, ldx, pos.data(), cs.data());
  auto xd = to_double(x);
  auto L = [&] {
    auto yy = xd;
    ref_rope(yy, T, H, d, ldx, pos, theta);
    double s = 0;
    for (int64_t i : xi) s += r[i] * yy[i];
    return s;
  };
  auto fd = scatter(T * ldx, xi, finite_diff(xd, xi, L));
  expect_close("rope dx", dx.data(), fd.data(), xi, kRtol, kAtol);
  for (int64_t i = 0; i < T * ldx; ++i)
    if (i % ldx >= H * d) {
      ASSERT_EQ(dx[i], sentinel) << "rope_bwd wrote padding " << i;
    }
}

// q heads inside a wider fused row (ldx > H·d).
TEST(RopeTest, ForwardBackwardStridedD16) { check_rope(7, 3, 16, 3 * 16 + 40, 7); }
TEST(RopeTest, ForwardBackwardContiguousD32) { check_rope(5, 2, 32, 64, 8); }
TEST(RopeTest, ForwardBackwardD128) { check_rope(3, 2, 128, 2 * 128 + 128, 9); }

// ---------------------------------------------------------------------------------------------
// SwiGLU

double silu(double a) { return a / (1.0 + std::exp(-a)); }

TEST(SwiGluTest, ForwardMatchesReference) {
  const int64_t T = 5, F = 37;
  std::mt19937 g(10);
  auto ab = uniform(T * 2 * F, g, -6.f, 6.f);
  // Saturated gates: silu(a) → a for a ≫ 0 and → 0 for a ≪ 0.
  ab[0] = 30.f, ab[1] = -30.f, ab[2] = 90.f, ab[3] = -90.f, ab[4] = 0.f;
  std::vector<float> out(T * F);
  swiglu_fwd(ab.data(), out.data(), T, F);
  std::vector<double> ref(T * F);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < F; ++i)
      ref[t * F + i] = silu(ab[t * 2 * F + i]) * ab[t * 2 * F + F + i];
  expect_close("swiglu g", out, ref, kRtol, 1e-6);
}

TEST(SwiGluTest, BackwardMatchesFiniteDifferences) {
  const int64_t T = 5, F = 37;
  std::mt19937 g(11);
  auto ab = uniform(T * 2 * F, g, -4.f, 4.f);
  auto r = uniform(T * F, g, -1.f, 1.f);
  std::vector<float> dab(T * 2 * F, 777.f);
  swiglu_bwd(r.data(), ab.data(), dab.data(), T, F);
  auto abd = to_double(ab);
  auto L = [&] {
    double s = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < F; ++i)
        s += r[t * F + i] * silu(abd[t * 2 * F + i]) * abd[t * 2 * F + F + i];
    return s;
  };
  auto fd = finite_diff(abd, iota_idx(T * 2 * F), L);
  expect_close("swiglu dab", dab, fd, kRtol, kAtol);
}

// ---------------------------------------------------------------------------------------------
// add / add_inplace (chunked in 16384-element units: n crosses two chunk edges)

TEST(AddTest, AddAndAddInplace) {
  const int64_t n = 2 * (1 << 14) + 5;
  std::mt19937 g(12);
  auto a = uniform(n, g, -1.f, 1.f), b = uniform(n, g, -1.f, 1.f);
  std::vector<float> out(n);
  add(a.data(), b.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  std::vector<float> y = a;
  add_inplace(y.data(), b.data(), n);
  EXPECT_EQ(y, out);
}

// copy_rows / sum_rows against plain loops: rows of 5 floats at strides 7 and 6, indexed and
// identity sides, and k = 3 rows summed per output in index order from 0 (large enough to run in
// parallel, 3000 rows).
TEST(RowsTest, CopyAndSumRowsAsIndexed) {
  const int64_t n = 3000, w = 5, k = 3;
  std::mt19937 g(13);
  const auto src = uniform(n * 7, g, -1.f, 1.f);
  std::vector<int32_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = static_cast<int32_t>((i * 17) % n);  // gcd(17, n) = 1
  std::vector<float> dst(n * 6, -9.f), want = dst;
  copy_rows(src.data(), 7, perm.data(), dst.data(), 6, nullptr, n, w);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < w; ++c) want[i * 6 + c] = src[perm[i] * 7 + c];
  EXPECT_EQ(dst, want);
  copy_rows(src.data(), 7, nullptr, dst.data(), 6, perm.data(), n, w);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < w; ++c) want[perm[i] * 6 + c] = src[i * 7 + c];
  EXPECT_EQ(dst, want);
  std::vector<float> sum(n / k * w), ref(n / k * w);
  sum_rows(src.data(), 7, perm.data(), k, sum.data(), n / k, w);
  for (int64_t t = 0; t < n / k; ++t)
    for (int64_t c = 0; c < w; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) acc += src[perm[t * k + j] * 7 + c];
      ref[t * w + c] = acc;
    }
  EXPECT_EQ(sum, ref);
}

}  // namespace
}  // namespace titan::ops
