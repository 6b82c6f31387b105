// training.dtype bfloat16: the projections' master weights are their bf16 compute copy, updated
// with stochastic rounding. The first step equals bf16 mixed precision's (the same weights are
// read), training follows it, the step in the backward equals the step at the end, a checkpoint
// resumes bitwise, and what cannot combine with it is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/dtype.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

config::JobConfig small() {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.training.local_batch_size = 4;
  c.training.seq_len = 32;
  c.training.steps = 12;
  c.training.mixed_precision_param = "bfloat16";
  c.lr_scheduler.warmup_steps = 2;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 7;
  return c;
}

// Every weight as fp32 (the bf16 masters widened, exactly).
std::vector<float> weights(Trainer& t) {
  t.model().store().widen_masters();
  const float* p = std::as_const(t.model().store()).param_data();
  std::vector<float> w(p, p + t.model().num_params());
  t.model().store().release_masters();
  return w;
}

TEST(PureBf16, TrainsLikeMixedPrecisionWithBf16Masters) {
  config::JobConfig c = small();
  Trainer mixed(c, titan::testing::fox_docs());
  c.training.dtype = "bfloat16";
  Trainer pure(c, titan::testing::fox_docs());
  ASSERT_TRUE(pure.model().store().masters_released());
  // The fp32 masters of the projections are given back: reading them unwidened is refused.
  EXPECT_NE(titan::testing::error_of([&] {
              (void)std::as_const(pure.model().store()).param_data();
            }).find("widen them first"),
            std::string::npos);
  std::vector<double> a, b;
  for (int i = 0; i < 12; ++i) {
    a.push_back(mixed.step().loss);
    b.push_back(pure.step().loss);
  }
  // Step 1 reads the same bf16 weights (the init rounded to nearest, as mixed precision's copy).
  EXPECT_EQ(a[0], b[0]);
  // Then the bf16 masters round each update (stochastically, unbiased): the curve follows mixed
  // precision's (measured within 3e-5 relative over these 12 steps; bound 1e-3) and falls.
  for (int i = 1; i < 12; ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "step " << i + 1;
  EXPECT_LT(b.back(), 0.85 * b.front());
  // A projection weight is a bf16 value; a norm weight keeps its fp32 master.
  const std::vector<float> w = weights(pure);
  const auto& q = pure.model().param("layers.0.attention.wq.weight");
  int64_t not_bf16 = 0;
  for (int64_t i = 0; i < q.numel; ++i)
    not_bf16 +=
        round_to_bf16(w[static_cast<size_t>(q.offset + i)]) != w[static_cast<size_t>(q.offset + i)];
  EXPECT_EQ(not_bf16, 0);
}

// The same keys and element indices: the update in the backward equals the step at the end,
// bitwise, for fp32 and 8-bit moments.
TEST(PureBf16, StepInBackwardGivesTheStepAtTheEndBitwise) {
  for (const char* moments : {"float32", "int8"}) {
    SCOPED_TRACE(moments);
    config::JobConfig c = small();
    c.training.dtype = "bfloat16";
    c.training.max_norm = 1e9;  // never clips
    c.optimizer.state_dtype = moments;
    Trainer end(c, titan::testing::fox_docs());
    c.optimizer.early_step_in_backward = true;
    Trainer in_bwd(c, titan::testing::fox_docs());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(end.step().loss, in_bwd.step().loss) << "step " << i + 1;
    EXPECT_EQ(weights(end), weights(in_bwd));
  }
}

TEST(PureBf16, ResumesBitwise) {
  const std::string dir = titan::testing::fresh_temp_dir("pure_bf16_resume");
  config::JobConfig c = small();
  c.training.dtype = "bfloat16";
  c.dump_folder = dir;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  std::vector<double> whole, resumed;
  {
    Trainer t(c, titan::testing::fox_docs());
    for (int i = 0; i < 4; ++i) {
      whole.push_back(t.step().loss);
      t.maybe_checkpoint();  // step 2's and 4's
    }
    EXPECT_TRUE(t.model().store().masters_released());  // given back again after the save
  }
  std::filesystem::remove_all(dir + "/checkpoint/step-4");
  {
    Trainer t(c, titan::testing::fox_docs());
    EXPECT_EQ(t.current_step(), 2);
    for (int i = 2; i < 4; ++i) resumed.push_back(t.step().loss);
  }
  EXPECT_EQ(resumed[0], whole[2]);
  EXPECT_EQ(resumed[1], whole[3]);
  std::filesystem::remove_all(dir);
}

TEST(PureBf16, RefusesFloat32ComputeAndLora) {
  config::JobConfig c = small();
  c.training.dtype = "bfloat16";
  c.training.mixed_precision_param = "float32";
  EXPECT_EQ(titan::testing::error_of([&] { Trainer t(c, titan::testing::fox_docs()); }),
            "training.dtype bfloat16 (bf16 master weights) computes in bf16, but "
            "training.mixed_precision_param is 'float32'; set it to bfloat16");
  c = small();
  c.training.dtype = "bfloat16";
  c.lora.rank = 4;
  EXPECT_NE(titan::testing::error_of([&] {
              Trainer t(c, titan::testing::fox_docs());
            }).find("does not apply to LoRA"),
            std::string::npos);
}

}  // namespace
}  // namespace titan::train
