// The training loop: determinism, gradient accumulation, and stopping on a non-finite loss.
#include "titan/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::train {
namespace {

std::vector<std::string> docs() { return titan::testing::fox_docs(); }

config::JobConfig small() {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.training.local_batch_size = 4;
  c.training.seq_len = 32;
  c.training.steps = 5;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 7;
  return c;
}

TEST(Trainer, SameSeedGivesBitwiseIdenticalLosses) {
  std::vector<double> a, b;
  for (auto* out : {&a, &b}) {
    Trainer t(small(), docs());
    for (int i = 0; i < 3; ++i) out->push_back(t.step().loss);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  EXPECT_LT(a[2], a[0]);
}

TEST(Trainer, DifferentSeedsDiffer) {
  config::JobConfig c = small();
  Trainer t1(c, docs());
  c.debug.seed = 8;
  Trainer t2(c, docs());
  EXPECT_NE(t1.step().loss, t2.step().loss);
}

TEST(Trainer, GradientAccumulationMatchesOneLargeBatch) {
  config::JobConfig big = small(), acc = small();
  acc.training.local_batch_size = 2;
  acc.training.global_batch_size = 4;
  Trainer t1(big, docs()), t2(acc, docs());
  EXPECT_EQ(t2.grad_accum_steps(), 2);
  for (int i = 0; i < 3; ++i) {
    StepResult r1 = t1.step(), r2 = t2.step();
    // Same rows, same token-mean loss; only GEMM blocking differs (fp32 rounding).
    EXPECT_NEAR(r1.loss, r2.loss, 1e-5 * r1.loss);
    EXPECT_NEAR(r1.grad_norm, r2.grad_norm, 1e-4 * r1.grad_norm);
    EXPECT_EQ(r1.valid_tokens, r2.valid_tokens);
  }
}

TEST(Trainer, NonFiniteLossStopsBeforeTheUpdate) {
  Trainer t(small(), docs());
  t.step();
  float* p = t.model().store().param_data();
  const int64_t n = t.model().num_params();
  p[t.model().param("norm.weight").offset] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> before(p, p + n);
  EXPECT_THROW(
      {
        try {
          t.step();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("the weights hold 1 non-finite value(s) (the "
                                               "first in 'norm.weight') after 1 update(s)"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  EXPECT_EQ(t.current_step(), 1);
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(before[i])) {
      ASSERT_EQ(before[i], p[i]) << "parameter " << i << " changed";
    }
  }
}

// NaN initial weights were reported as "lower optimizer.lr": at the first step (no update yet)
// the weights are at fault, and the message says so.
TEST(Trainer, NonFiniteInitialWeightsAreNamedNotTheLearningRate) {
  Trainer t(small(), docs());
  t.model().store().param_data()[t.model().param("norm.weight").offset] =
      std::numeric_limits<float>::infinity();
  const std::string msg = titan::testing::error_of([&] { t.step(); });
  EXPECT_NE(msg.find("the initial weights from the seeded random init hold 1 non-finite value(s) "
                     "(the first in 'norm.weight'); check them"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("optimizer.lr"), std::string::npos) << msg;
  EXPECT_EQ(t.current_step(), 0);
}

TEST(Trainer, LearningRateFollowsTheSchedule) {
  config::JobConfig c = small();
  c.training.steps = 10;
  c.lr_scheduler.warmup_steps = 2;
  Trainer t(c, docs());
  const double expect[] = {0.5, 1, 1, 7.0 / 8, 6.0 / 8};
  for (double e : expect) EXPECT_NEAR(t.step().lr, c.optimizer.lr * e, 1e-12);
}

}  // namespace
}  // namespace titan::train
