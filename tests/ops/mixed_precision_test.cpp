// The mixed-precision kernels (bf16 GEMM inputs, fp32 accumulation):
//   to_bf16: bitwise the same as core/dtype.h's f32_to(BF16) (round to nearest even, NaN, inf);
//   from_bf16: bitwise to_f32(BF16), so from_bf16(to_bf16(x)) is round_to_bf16(x).
//   linear_fwd_bf16 / linear_bwd_bf16: against a double reference on the bf16-rounded operands
//     (their definition: bf16 products are exact in fp32, so only fp32 accumulation over K <= 80
//     terms differs: 1e-5 of the tensor's scale), and against the exact double reference of the
//     fp32 layer at the bf16 level (1e-2 of scale: each operand is off by at most u = 2^-8).
//   lm_head_ce_bf16: loss, dh and dw against the exact double reference at the bf16 level, the
//     loss to 1e-3 relative (the CE of O(1) logits moves by about u·|logit|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reference_util.h"
#include "titan/core/dtype.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"
#include "titan/ops/loss.h"

namespace titan::ops {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

std::vector<double> rounded(const std::vector<float>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to_bf16(v[i]);
  return r;
}

std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  f32_to(DType::BF16, v.data(), static_cast<int64_t>(v.size()), r.data());
  return r;
}

TEST(MixedPrecision, ToBf16IsBitwiseF32To) {
  std::mt19937 g(5);
  std::vector<float> x = uniform(100000, g, -3.f, 3.f);  // > one parallel chunk
  const float specials[] = {0.f,
                            -0.f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            1.00390625f,   // 1 + 2^-8: a tie, rounds to even (1)
                            1.01171875f};  // 1 + 3·2^-8: a tie, rounds to even (1 + 2^-6)
  for (size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  std::vector<uint16_t> got(x.size());
  to_bf16(x.data(), static_cast<int64_t>(x.size()), got.data());
  EXPECT_EQ(got, bf16_of(x));
  EXPECT_EQ(got[8], 0x3f80);
  EXPECT_EQ(got[9], 0x3f82);
  std::vector<float> wide(x.size()), want(x.size());
  from_bf16(got.data(), static_cast<int64_t>(got.size()), wide.data());
  to_f32(DType::BF16, got.data(), static_cast<int64_t>(got.size()), want.data());
  EXPECT_EQ(std::memcmp(wide.data(), want.data(), 4 * wide.size()), 0);
}

TEST(MixedPrecision, LinearForwardAndBackward) {
  const int64_t M = 33, in = 80, out = 47;
  std::mt19937 g(7);
  const std::vector<float> x = uniform(M * in, g, -1, 1), w = uniform(out * in, g, -0.3f, 0.3f),
                           dy = uniform(M * out, g, -1, 1);
  const std::vector<uint16_t> wb = bf16_of(w);
  std::vector<uint16_t> scratch(M * (in + out));
  std::vector<float> y(M * out), dx(M * in), dw(out * in, 0.5f);
  linear_fwd_bf16(x.data(), wb.data(), y.data(), M, in, out, scratch.data());
  linear_bwd_bf16(dy.data(), x.data(), wb.data(), dx.data(), dw.data(), M, in, out, false,
                  scratch.data());
  // References: on the rounded operands (r*) and exact (e*). dw accumulates onto 0.5.
  for (bool exact : {false, true}) {
    const std::vector<double> X = exact ? kernel_test::to_double(x) : rounded(x),
                              W = exact ? kernel_test::to_double(w) : rounded(w),
                              DY = exact ? kernel_test::to_double(dy) : rounded(dy);
    std::vector<double> ry(M * out, 0), rdx(M * in, 0), rdw(out * in, 0.5);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k) {
          ry[m * out + o] += X[m * in + k] * W[o * in + k];
          rdx[m * in + k] += DY[m * out + o] * W[o * in + k];
          rdw[o * in + k] += DY[m * out + o] * X[m * in + k];
        }
    const double tol = exact ? 1e-2 : 1e-5;
    const double ey = expect_close(exact ? "y exact" : "y rounded", y, ry, 0, tol);
    expect_close(exact ? "dx exact" : "dx rounded", dx, rdx, 0, tol);
    expect_close(exact ? "dw exact" : "dw rounded", dw, rdw, 0, tol);
    if (exact) {
      EXPECT_GT(ey, 1e-5);  // the bf16 rounding is really there
    }
  }
}

TEST(MixedPrecision, LmHeadCrossEntropyAcrossChunks) {
  const int64_t T = 29, D = 40, V = 53, chunk = 8;  // chunk edges inside the batch
  std::mt19937 g(9);
  const std::vector<float> h = uniform(T * D, g, -1, 1), w = uniform(V * D, g, -0.4f, 0.4f);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = t % 5 == 3 ? kIgnoreIndex : (t * 7) % V;
  const std::vector<uint16_t> wb = bf16_of(w);
  std::vector<float> scratch(lm_head_ce_bf16_scratch(T, V, D, chunk)), dh(T * D), dw(V * D, 0.f);
  const float scale = 1.0f / 23.0f;
  const LossSum ls = lm_head_ce_bf16(h.data(), wb.data(), labels.data(), T, D, V, chunk, scale,
                                     dh.data(), dw.data(), scratch.data());
  // Exact double reference.
  double sum = 0;
  int64_t count = 0;
  std::vector<double> rdh(T * D, 0), rdw(V * D, 0), z(V);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreIndex) continue;
    ++count;
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      z[v] = 0;
      for (int64_t d = 0; d < D; ++d) z[v] += static_cast<double>(h[t * D + d]) * w[v * D + d];
      mx = std::max(mx, z[v]);
    }
    double se = 0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(z[v] - mx);
    const double lse = mx + std::log(se);
    sum += lse - z[labels[t]];
    for (int64_t v = 0; v < V; ++v) {
      const double dz = scale * (std::exp(z[v] - lse) - (v == labels[t] ? 1.0 : 0.0));
      for (int64_t d = 0; d < D; ++d) {
        rdh[t * D + d] += dz * w[v * D + d];
        rdw[v * D + d] += dz * h[t * D + d];
      }
    }
  }
  EXPECT_EQ(ls.count, count);
  EXPECT_NEAR(ls.sum, sum, 1e-3 * sum);
  expect_close("dh", dh, rdh, 0, 1e-2);
  expect_close("dw", dw, rdw, 0, 1e-2);
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dh[3 * D + d], 0.f);  // an ignored row
}

}  // namespace
}  // namespace titan::ops
