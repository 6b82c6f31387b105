// AdamW against torch.optim.AdamW's single-tensor formula written out in double, and the
// gradient-norm helpers against double references.
#include "titan/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace titan::optim
