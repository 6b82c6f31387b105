// AdamW against torch.optim.AdamW's single-tensor formula written out in double, and the
// gradient-norm helpers against double references.
#include "titan/optim/adamw.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../ops/reference_util.h"

namespace titan::optim {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

// torch/optim/adamw.py, _single_tensor_adamw (capturable=False, amsgrad=False, maximize=False):
//   param.mul_(1 - lr * weight_decay)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
//   step_size = lr / bias_correction1
//   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
void ref_adamw(std::vector<double>& p, const std::vector<float>& g, std::vector<double>& m,
               std::vector<double>& v, const AdamWConfig& c, double lr, int64_t step) {
  const double b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(step));
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - lr * wd;
    m[i] += (1 - b1) * (g[i] - m[i]);
    v[i] = b2 * v[i] + (1 - b2) * double(g[i]) * g[i];
    p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

// Three steps with weight decay and a different lr each step, over 2 blocks of 16384 and a tail.
// Tolerance: fp32 state vs double, 1e-6 relative plus 1e-6 of the tensor's magnitude (a few fp32
// roundings of O(1) values per step; updates are O(lr) = 1e-3).
TEST(AdamWTest, ThreeStepsMatchTorchSingleTensorFormula) {
  const int64_t n = 2 * (1 << 14) + 37;
  std::mt19937 gen(1);
  auto p = uniform(n, gen, -1.f, 1.f);
  std::vector<float> m(n, 0.f), v(n, 0.f);
  std::vector<double> pr(p.begin(), p.end()), mr(n, 0.0), vr(n, 0.0);
  AdamWConfig c;
  c.lr = 123.f;  // adamw_step uses its lr argument, not c.lr
  c.beta1 = 0.9f, c.beta2 = 0.95f, c.eps = 1e-8f, c.weight_decay = 0.1f;
  const float lrs[3] = {1e-3f, 5e-4f, 2e-3f};
  for (int64_t step = 1; step <= 3; ++step) {
    auto g = uniform(n, gen, -1.f, 1.f);
    for (int64_t i = 0; i < n; i += 97) g[i] *= 1e-7f;  // |g| near eps: denominators with eps
    g[5] = 0.f;
    adamw_step(p.data(), g.data(), m.data(), v.data(), n, c, lrs[step - 1], step);
    ref_adamw(pr, g, mr, vr, c, lrs[step - 1], step);
    SCOPED_TRACE("step " + std::to_string(step));
    expect_close("p step " + std::to_string(step), p, pr, 1e-6, 1e-6);
    expect_close("m step " + std::to_string(step), m, mr, 1e-6, 1e-6);
    expect_close("v step " + std::to_string(step), v, vr, 1e-5, 1e-6);
  }
}

TEST(AdamWTest, SumSquaresMatchesDouble) {
  std::mt19937 gen(2);
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{3 * (1 << 14) + 123}}) {
    auto x = uniform(n, gen, -3.f, 3.f);
    double want = 0;
    for (float a : x) want += double(a) * a;
    EXPECT_NEAR(sum_squares(x.data(), n), want, 1e-12 * want) << "n = " << n;
  }
}

// torch clip_grads_with_norm_: g *= min(1, max_norm / (norm + 1e-6)).
TEST(AdamWTest, ClipByNormScalesOnlyAboveMaxNorm) {
  const int64_t n = 1000;
  std::mt19937 gen(3);
  const auto g0 = uniform(n, gen, -1.f, 1.f);
  const double norm = std::sqrt(sum_squares(g0.data(), n));

  for (double max_norm : {2.0 * norm, norm * (1 + 1e-3), 1e9}) {  // below max_norm: unchanged
    auto g = g0;
    clip_by_norm(g.data(), n, norm, max_norm);
    EXPECT_EQ(g, g0) << "max_norm " << max_norm << " norm " << norm;
  }
  for (double max_norm : {0.5 * norm, norm * (1 - 1e-3), 1e-3}) {  // above: scaled to max_norm
    auto g = g0;
    clip_by_norm(g.data(), n, norm, max_norm);
    const float coef = static_cast<float>(max_norm / (norm + 1e-6));
    for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(g[i], g0[i] * coef) << i;
    EXPECT_NEAR(std::sqrt(sum_squares(g.data(), n)), max_norm, 1e-5 * max_norm);
  }
  auto z = std::vector<float>(n, 0.f);  // zero gradient: coef = max_norm / 1e-6, clamped to 1
  clip_by_norm(z.data(), n, 0.0, 1.0);
  EXPECT_EQ(z, std::vector<float>(n, 0.f));
}

// Stochastic rounding to bf16 is unbiased: over many draws the mean of round(x) is x within its
// standard error (the rounding is a Bernoulli choice between the two neighbours, probability
// given by the discarded bits), for values at several positions between two bf16 neighbours,
// negative ones and a subnormal; each draw is one of the two neighbours.
TEST(StochasticRounding, IsUnbiased) {
  const int64_t N = 200000;
  for (float x : {1.0f + 0.3f * 0x1p-7f, -3.0f - 0.71f * 0x1p-6f, 1e-3f, 1.0f + 0x1p-20f,
                  0x1p-130f * 1.37f}) {
    uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    const float lo = bf16_to_float(static_cast<uint16_t>(b >> 16));
    const float hi = bf16_to_float(static_cast<uint16_t>((b >> 16) + 1));
    const double p_up = static_cast<double>(b & 0xFFFFu) / 65536.0;
    double sum = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float r = bf16_to_float(bf16_stochastic(x, sr_bits(77, static_cast<uint64_t>(i))));
      ASSERT_TRUE(r == lo || r == hi) << x << " rounded to " << r;
      sum += r;
    }
    const double mean = sum / N;
    const double se = std::abs(double(hi) - lo) * std::sqrt(p_up * (1 - p_up) / N);
    EXPECT_NEAR(mean, x, 4 * se + 1e-12 * std::abs(x)) << "x = " << x << ", p(up) " << p_up;
  }
  // Exact bf16 values stay; NaN stays NaN; inf stays inf.
  for (uint32_t r : {0u, 0xFFFFu, 0x8000u}) {
    EXPECT_EQ(bf16_to_float(bf16_stochastic(1.5f, r)), 1.5f);
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16_stochastic(std::nanf(""), r))));
    EXPECT_EQ(bf16_to_float(bf16_stochastic(INFINITY, r)), INFINITY);
  }
}

// AdamW with bf16 moments against a double-precision AdamW whose moments are stored the same
// way: each step the reference widens the bf16 moments, updates in double, rounds the result
// to fp32 and then to bf16 with the same random bits (sr_bits(key, i)). The kernel computes in
// fp32, so a stored moment may land on the other neighbour when its fp32 and double values
// straddle the random threshold: probability about 2^-16 per element and step, so at most 0.1%
// of elements may differ, each by one bf16 step (the reference then goes on from the kernel's
// moments). The weights: 1e-5 relative plus 1e-4 of the tensor's magnitude (O(1)): fp32
// arithmetic is ~1e-7, but a moment one bf16 step apart moves that element's update, at most
// lr/(1 − β1) = 1e-2 at step 1, by 2^-8 of it, 4e-5; a wrong formula is off by 1e-3 or more.
TEST(AdamWTest, Bf16MomentsMatchDoubleWithTheSameRounding) {
  const int64_t n = 2 * (1 << 14) + 37;
  std::mt19937 gen(4);
  auto p = uniform(n, gen, -1.f, 1.f);
  std::vector<uint16_t> m(n, 0), v(n, 0);
  std::vector<double> pr(p.begin(), p.end());
  std::vector<uint16_t> mr(n, 0), vr(n, 0);
  AdamWConfig c;
  c.beta1 = 0.9f, c.beta2 = 0.95f, c.eps = 1e-8f, c.weight_decay = 0.1f;
  const float lrs[3] = {1e-3f, 5e-4f, 2e-3f};
  int64_t differ = 0;
  for (int64_t step = 1; step <= 3; ++step) {
    auto g = uniform(n, gen, -1.f, 1.f);
    const uint64_t key = 1000 + static_cast<uint64_t>(step);
    adamw_step_bf16(p.data(), g.data(), m.data(), v.data(), n, c, lrs[step - 1], step, key);
    const double lr = lrs[step - 1], b1 = c.beta1, b2 = c.beta2;
    const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
    for (int64_t i = 0; i < n; ++i) {
      double mi = bf16_to_float(mr[i]), vi = bf16_to_float(vr[i]);
      pr[i] *= 1 - lr * c.weight_decay;
      mi += (1 - b1) * (g[i] - mi);
      vi = b2 * vi + (1 - b2) * double(g[i]) * g[i];
      pr[i] -= (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + c.eps);
      const uint32_t r = sr_bits(key, static_cast<uint64_t>(i));
      mr[i] = bf16_stochastic(static_cast<float>(mi), r);
      vr[i] = bf16_stochastic(static_cast<float>(vi), r >> 16);
    }
    for (int64_t i = 0; i < n; ++i)
      for (auto [a, b] : {std::pair{m[i], mr[i]}, std::pair{v[i], vr[i]}}) {
        if (a == b) continue;
        ++differ;
        ASSERT_EQ(std::abs(int(a) - int(b)), 1) << "step " << step << " element " << i;
        mr[i] = m[i], vr[i] = v[i];  // the reference goes on from the kernel's state
      }
    expect_close("p step " + std::to_string(step), p, pr, 1e-5, 1e-4);
  }
  EXPECT_LE(differ, 3 * 2 * n / 1000) << differ << " stored moments differ";
}

// The same key gives the same bits whatever the thread count; another key other bits.
TEST(AdamWTest, Bf16MomentsAreReproducibleAcrossThreadCounts) {
  const int64_t n = 3 * (1 << 14) + 5;
  std::mt19937 gen(5);
  const auto p0 = uniform(n, gen, -1.f, 1.f), g = uniform(n, gen, -1.f, 1.f);
  auto run = [&](int threads, uint64_t key) {
    const int was = omp_get_max_threads();
    omp_set_num_threads(threads);
    auto p = p0;
    std::vector<uint16_t> m(n, 0), v(n, 0);
    for (int64_t step = 1; step <= 2; ++step)
      adamw_step_bf16(p.data(), g.data(), m.data(), v.data(), n, AdamWConfig{}, 1e-3f, step, key);
    omp_set_num_threads(was);
    return std::pair{m, v};
  };
  EXPECT_EQ(run(1, 9), run(2, 9));
  EXPECT_NE(run(1, 9).first, run(1, 10).first);
}

}  // namespace
}  // namespace titan::optim
