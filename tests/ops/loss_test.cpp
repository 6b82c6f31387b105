// Chunked lm_head + cross-entropy against a naive double reference:
//   logits[t] = h[t]·wᵀ,  ce[t] = logsumexp(logits[t]) − logits[t][label[t]]  (label != -100)
// and its gradients against central finite differences of the double reference loss
// grad_scale·Σ_t ce[t] (eps = 1e-5). Tolerance: 1e-4 relative plus 1e-4 of the gradient
// tensor's largest magnitude (fp32 GEMMs over D = 24 and a softmax over V = 37 are ~1e-6 off).
#include "titan/ops/loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "reference_util.h"
#include "titan/core/error.h"

namespace titan::ops {
namespace {

using kernel_test::expect_close;
using kernel_test::finite_diff;
using kernel_test::iota_idx;
using kernel_test::to_double;
using kernel_test::uniform;

constexpr double kRtol = 1e-4, kAtol = 1e-4;

double ref_ce_sum(const std::vector<double>& h, const std::vector<double>& w,
                  const std::vector<int32_t>& labels, int64_t T, int64_t D, int64_t V,
                  int64_t* count = nullptr) {
  double total = 0;
  int64_t n = 0;
  std::vector<double> z(V);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreIndex) continue;
    double mx = -1e300;
    for (int64_t j = 0; j < V; ++j) {
      z[j] = 0;
      for (int64_t c = 0; c < D; ++c) z[j] += h[t * D + c] * w[j * D + c];
      mx = std::max(mx, z[j]);
    }
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(z[j] - mx);
    total += mx + std::log(s) - z[labels[t]];
    ++n;
  }
  if (count) *count = n;
  return total;
}

struct Data {
  int64_t T = 10, D = 24, V = 37;
  std::vector<float> h, w;
  std::vector<int32_t> labels;
};

Data make_data(uint32_t seed, float h_scale = 1.f) {
  Data x;
  std::mt19937 g(seed);
  x.h = uniform(x.T * x.D, g, -h_scale, h_scale);
  x.w = uniform(x.V * x.D, g, -1.f, 1.f);
  x.labels.resize(x.T);
  for (auto& l : x.labels) l = static_cast<int32_t>(g() % x.V);
  x.labels[0] = 0;
  x.labels[1] = static_cast<int32_t>(x.V - 1);
  x.labels[2] = kIgnoreIndex;
  x.labels[7] = kIgnoreIndex;
  return x;
}

LossSum run(const Data& x, int64_t chunk, float grad_scale, float* dh, float* dw) {
  std::vector<float> scratch(lm_head_ce_scratch(x.T, x.V, chunk));
  return lm_head_ce(x.h.data(), x.w.data(), x.labels.data(), x.T, x.D, x.V, chunk, grad_scale, dh,
                    dw, scratch.data());
}

// Loss sum and count for chunk sizes that do and do not divide T, and chunks >= T.
TEST(LmHeadCeTest, ForwardMatchesReferenceForAllChunkSizes) {
  for (float h_scale : {1.f, 12.f}) {  // 12: logits of ±50, the max-subtraction path
    Data x = make_data(1, h_scale);
    int64_t count = 0;
    const double want = ref_ce_sum(to_double(x.h), to_double(x.w), x.labels, x.T, x.D, x.V, &count);
    ASSERT_EQ(count, 8);
    for (int64_t chunk : {1, 3, 4, 10, 16}) {
      LossSum got = run(x, chunk, 0.f, nullptr, nullptr);
      EXPECT_EQ(got.count, 8) << "chunk " << chunk;
      // fp32 logits (D = 24 terms of |h·w| ≤ 12) are ~1e-5 off per token.
      EXPECT_NEAR(got.sum, want, 1e-5 * std::abs(want) + 1e-4 * h_scale)
          << "chunk " << chunk << " h_scale " << h_scale;
    }
  }
}

TEST(LmHeadCeTest, GradientsMatchFiniteDifferencesForAllChunkSizes) {
  Data x = make_data(2);
  const float grad_scale = 1.0f / 8.0f;  // 1 / count
  auto hd = to_double(x.h), wd = to_double(x.w);
  auto L = [&] { return grad_scale * ref_ce_sum(hd, wd, x.labels, x.T, x.D, x.V); };
  const auto dh_fd = finite_diff(hd, iota_idx(x.T * x.D), L);
  const auto dw_fd = finite_diff(wd, iota_idx(x.V * x.D), L);
  const double want = ref_ce_sum(hd, wd, x.labels, x.T, x.D, x.V);

  std::mt19937 g(3);
  const auto dw0 = uniform(x.V * x.D, g, -1.f, 1.f);
  std::vector<float> dh_first, dw_first;
  for (int64_t chunk : {3, 10, 16, 1}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    std::vector<float> dh(x.T * x.D, 777.f), dw = dw0;
    LossSum got = run(x, chunk, grad_scale, dh.data(), dw.data());
    EXPECT_EQ(got.count, 8);
    EXPECT_NEAR(got.sum, want, 1e-5 * std::abs(want));
    expect_close("dh chunk " + std::to_string(chunk), dh, dh_fd, kRtol, kAtol);
    std::vector<double> dw_delta(dw.size());
    for (size_t i = 0; i < dw.size(); ++i) dw_delta[i] = double(dw[i]) - dw0[i];
    expect_close("dw chunk " + std::to_string(chunk), dw_delta, dw_fd, kRtol, kAtol);
    for (int64_t t : {2, 7})
      for (int64_t c = 0; c < x.D; ++c) ASSERT_EQ(dh[t * x.D + c], 0.f) << "ignored row " << t;
    // Chunkings agree with each other (different GEMM shapes: not necessarily bit-identical).
    if (dh_first.empty()) {
      dh_first = dh, dw_first = dw;
    } else {
      for (size_t i = 0; i < dh.size(); ++i) EXPECT_NEAR(dh[i], dh_first[i], 1e-6);
      for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], dw_first[i], 1e-6);
    }
  }
}

// dw accumulates: two calls add twice the gradient.
TEST(LmHeadCeTest, WeightGradientAccumulates) {
  Data x = make_data(4);
  std::vector<float> dh(x.T * x.D), dw1(x.V * x.D, 0.f), dw2(x.V * x.D, 0.f);
  run(x, 4, 0.125f, dh.data(), dw1.data());
  run(x, 4, 0.125f, dh.data(), dw2.data());
  run(x, 4, 0.125f, dh.data(), dw2.data());
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw1[i], 1e-6);
}

TEST(LmHeadCeTest, AllIgnoredGivesNoLossAndZeroGradient) {
  Data x = make_data(5);
  std::fill(x.labels.begin(), x.labels.end(), kIgnoreIndex);
  std::vector<float> dh(x.T * x.D, 777.f), dw(x.V * x.D, 0.5f);
  LossSum got = run(x, 3, 1.0f, dh.data(), dw.data());
  EXPECT_EQ(got.count, 0);
  EXPECT_EQ(got.sum, 0.0);
  for (float v : dh) ASSERT_EQ(v, 0.f);
  for (float v : dw) ASSERT_EQ(v, 0.5f);
}

TEST(LmHeadCeTest, ZeroGradScaleLeavesGradientsUntouched) {
  Data x = make_data(6);
  std::vector<float> dh(x.T * x.D, 777.f), dw(x.V * x.D, 0.5f);
  LossSum got = run(x, 3, 0.f, dh.data(), dw.data());
  EXPECT_EQ(got.count, 8);
  for (float v : dh) ASSERT_EQ(v, 777.f);
  for (float v : dw) ASSERT_EQ(v, 0.5f);
}

TEST(LmHeadCeTest, OutOfRangeLabelThrows) {
  for (int32_t bad : {37, 1000, -1, -101}) {
    Data x = make_data(7);
    x.labels[5] = bad;
    std::vector<float> dh(x.T * x.D), dw(x.V * x.D);
    EXPECT_THROW(run(x, 3, 0.125f, dh.data(), dw.data()), titan::Error) << "label " << bad;
  }
}

}  // namespace
}  // namespace titan::ops
