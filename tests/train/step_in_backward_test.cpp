// optimizer.early_step_in_backward: the updates made unit by unit in the backward give the same
// weights as the step at the end (without clipping), free the gradients, and refuse what they
// cannot do.
#include "titan/train/step_in_backward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

config::JobConfig small() {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.training.local_batch_size = 4;
  c.training.seq_len = 32;
  c.training.steps = 5;
  c.training.max_norm = 1e9;  // never clips: the step at the end is then the same update
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 7;
  return c;
}

std::vector<float> weights(Trainer& t) {
  const float* p = t.model().store().param_data();
  return {p, p + t.model().num_params()};
}

// Element by element the same AdamW update on the same gradient: bitwise equal, for fp32, bf16
// and 8-bit moments (the rounding bits of an element do not depend on the range updated; an
// 8-bit block never crosses a parameter's start, so a unit's blocks are its own) and under bf16
// mixed precision.
TEST(StepInBackward, GivesTheWeightsOfTheStepAtTheEndBitwise) {
  for (const char* moments : {"float32", "bfloat16", "int8"})
    for (const char* mp : {"float32", "bfloat16"}) {
      SCOPED_TRACE(std::string(moments) + " moments, mixed_precision_param " + mp);
      config::JobConfig c = small();
      c.optimizer.state_dtype = moments;
      c.training.mixed_precision_param = mp;
      Trainer end(c, titan::testing::fox_docs());
      c.optimizer.early_step_in_backward = true;
      Trainer in_bwd(c, titan::testing::fox_docs());
      for (int i = 0; i < 3; ++i) {
        const StepResult a = end.step(), b = in_bwd.step();
        EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
        // Σg² in double over other blocks (per unit): equal to double rounding.
        EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * a.grad_norm) << "step " << i + 1;
      }
      EXPECT_EQ(weights(end), weights(in_bwd));
      // Every unit's gradient was given back after its update.
      const float* g = in_bwd.model().store().grads();
      int64_t nonzero = 0;
      for (int64_t i = 0; i < in_bwd.model().num_params(); ++i) nonzero += g[i] != 0.0f;
      EXPECT_EQ(nonzero, 0);
    }
}

TEST(StepInBackward, RefusesGradientAccumulation) {
  config::JobConfig c = small();
  c.optimizer.early_step_in_backward = true;
  c.training.local_batch_size = 2;
  c.training.global_batch_size = 4;
  const std::string msg =
      titan::testing::error_of([&] { Trainer t(c, titan::testing::fox_docs()); });
  EXPECT_NE(msg.find("optimizer.early_step_in_backward updates each unit as soon as the backward "
                     "finishes its gradient, so it cannot accumulate gradients over 2 "
                     "microbatches: set training.global_batch_size to local_batch_size × the "
                     "data-parallel degree (2)"),
            std::string::npos)
      << msg;
}

// A non-finite loss: the head's gradient, the first complete, is not finite, so nothing is
// updated and the step stops saying what was.
TEST(StepInBackward, NonFiniteGradientStopsTheUpdates) {
  config::JobConfig c = small();
  c.optimizer.early_step_in_backward = true;
  Trainer t(c, titan::testing::fox_docs());
  t.step();
  t.model().store().param_data()[t.model().param("norm.weight").offset] =
      std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = weights(t);
  const std::string msg = titan::testing::error_of([&] { t.step(); });
  EXPECT_NE(msg.find("with optimizer.early_step_in_backward the units the backward finished "
                     "before the first non-finite gradient were updated, the rest not"),
            std::string::npos)
      << msg;
  const std::vector<float> after = weights(t);
  for (size_t i = 0; i < before.size(); ++i)
    if (!std::isnan(before[i])) {
      ASSERT_EQ(before[i], after[i]) << "parameter " << i;
    }
}

}  // namespace
}  // namespace titan::train
