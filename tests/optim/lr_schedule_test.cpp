// LRSchedule::factor against torchtitan's warmup-stable-decay multiplier
// (torchtitan/components/lr_scheduler.py, build_lr_schedulers / linear_warmup_stable_decay):
//   warmup = min(warmup, total)
//   decay = round(total·decay_ratio), reduced to total − warmup when warmup + decay > total
//           (or total − warmup without decay_ratio)
//   stable = total + 1 − warmup − decay          (a virtual last step keeps the lr above 0)
//   s < warmup: (s+1)/warmup;  s < warmup+stable: 1;
//   else p = (s+1 − warmup − stable)/decay, f = 1−p | 1−√p | ½(1+cos πp),
//        min_lr_factor + (1 − min_lr_factor)·f
#include "titan/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "titan/core/error.h"

namespace titan::optim {
namespace {

LRSchedule make(int64_t total, int64_t warmup, const char* type = "linear",
                std::optional<double> ratio = std::nullopt, double min_lr = 0.0) {
  LRSchedule s;
  s.total_steps = total;
  s.warmup_steps = warmup;
  s.decay_type = type;
  s.decay_ratio = ratio;
  s.min_lr_factor = min_lr;
  return s;
}

void expect_factors(const LRSchedule& s, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(s.factor(static_cast<int64_t>(i)), want[i], 1e-12) << "scheduler step " << i;
}

// steps = 10, warmup = 2: decay = 8, stable = 1.
TEST(LRScheduleTest, LinearWarmupThenDecay) {
  expect_factors(make(10, 2),
                 {0.5, 1.0, 1.0, 7 / 8.0, 6 / 8.0, 5 / 8.0, 4 / 8.0, 3 / 8.0, 2 / 8.0, 1 / 8.0});
}

TEST(LRScheduleTest, NoWarmup) { expect_factors(make(4, 0), {1.0, 0.75, 0.5, 0.25}); }

// decay_ratio 0.5: decay = 5, stable = 4.
TEST(LRScheduleTest, DecayRatio) {
  expect_factors(make(10, 2, "linear", 0.5), {0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2});
}

// Python round() is half-to-even: round(2.5) = 2 and round(1.5) = 2.
TEST(LRScheduleTest, DecayRatioRoundsHalfToEven) {
  expect_factors(make(10, 2, "linear", 0.25), {0.5, 1, 1, 1, 1, 1, 1, 1, 1, 0.5});
  expect_factors(make(6, 1, "linear", 0.25), {1, 1, 1, 1, 1, 0.5});
}

// torchtitan: "Warmup + decay steps exceed total training steps. Adjusting decay steps to
// total − warmup." steps = 5, warmup = 2, decay_ratio = 0.8: round(4.0) = 4 > 5 − 2, so
// decay = 3, stable = 1: factors 0.5, 1, 1, 2/3, 1/3.
TEST(LRScheduleTest, DecayRatioReducedWhenWarmupPlusDecayExceedsTotal) {
  expect_factors(make(5, 2, "linear", 0.8), {0.5, 1.0, 1.0, 2 / 3.0, 1 / 3.0});
}

// warmup > total: warmup = total, decay = 0, stable = 1.
TEST(LRScheduleTest, WarmupLongerThanTraining) {
  expect_factors(make(3, 5), {1 / 3.0, 2 / 3.0, 1.0});
}

TEST(LRScheduleTest, SqrtDecay) {
  std::vector<double> want = {0.5, 1.0, 1.0};
  for (int k = 1; k <= 7; ++k) want.push_back(1 - std::sqrt(k / 8.0));
  expect_factors(make(10, 2, "sqrt"), want);
}

TEST(LRScheduleTest, CosineDecay) {
  std::vector<double> want = {0.5, 1.0, 1.0};
  for (int k = 1; k <= 7; ++k) want.push_back(0.5 * (1 + std::cos(M_PI * k / 8.0)));
  expect_factors(make(10, 2, "cosine"), want);
}

// min_lr_factor rescales only the decay phase: warmup and stable values are unchanged.
TEST(LRScheduleTest, MinLrFactor) {
  std::vector<double> lin = {0.5, 1.0, 1.0}, cos = {0.5, 1.0, 1.0};
  for (int k = 1; k <= 7; ++k) {
    lin.push_back(0.1 + 0.9 * (1 - k / 8.0));
    cos.push_back(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * k / 8.0)));
  }
  expect_factors(make(10, 2, "linear", std::nullopt, 0.1), lin);
  expect_factors(make(10, 2, "cosine", std::nullopt, 0.1), cos);
}

TEST(LRScheduleTest, UnknownDecayTypeThrows) {
  EXPECT_THROW(make(10, 2, "exponential").factor(9), titan::Error);
}

}  // namespace
}  // namespace titan::optim
