// The memory plan against the process's measured peak RSS: within 10% for the real configured
// shapes (debugmodel 4x256 in bf16 and fp32, with and without full AC; debugmodel_moe 2x128; a
// 2-layer model of Qwen3-0.6B's widths at 1x2048 in bf16 with full AC), and titan train refuses a
// plan that cannot fit.
#include "titan/train/memory_plan.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/core/cpu.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {
using testing::error_of;
using testing::fresh_temp_dir;

void expect_plan_matches_peak(config::JobConfig c) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and redzones add ~1/8 to the resident set; "
                  "the plan is compared with peak RSS in the Release build";
#endif
  c.dump_folder = fresh_temp_dir("memory_plan");
  c.training.steps = 2;
  c.metrics.log_freq = 1;
  const MemoryPlan plan = plan_memory(c);
  Trainer t(c);
  t.train();
  const double peak = static_cast<double>(cpu::peak_rss_bytes());
  const double planned = static_cast<double>(plan.total());
  EXPECT_LT(std::abs(planned - peak) / peak, 0.10) << plan.format() << "measured peak " << peak;
}

TEST(MemoryPlan, DebugModelWithinTenPercentOfPeakRss) {
  config::register_builtin_configs();
  expect_plan_matches_peak(config::make_config("qwen3_debugmodel"));
}

TEST(MemoryPlan, DebugModelFp32FullAcWithinTenPercentOfPeakRss) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_debugmodel");
  c.training.mixed_precision_param = "float32";
  c.activation_checkpoint.mode = "full";
  expect_plan_matches_peak(c);
}

TEST(MemoryPlan, DebugModelBf16FullAcWithinTenPercentOfPeakRss) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_debugmodel");
  c.activation_checkpoint.mode = "full";
  expect_plan_matches_peak(c);
}

TEST(MemoryPlan, Qwen3_0_6BWidthTwoLayersSeq2048WithinTenPercentOfPeakRss) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_0_6b");
  c.model.n_layers = 2;
  c.training.local_batch_size = 1;
  c.training.seq_len = 2048;
  c.activation_checkpoint.mode = "full";
  c.validator.enable = false;
  expect_plan_matches_peak(c);
}

TEST(MemoryPlan, DebugMoeWithinTenPercentOfPeakRss) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_debugmodel_moe");
  c.training.local_batch_size = 2;
  c.training.seq_len = 128;
  expect_plan_matches_peak(c);
}

TEST(MemoryPlan, TrainRefusesAPlanThatCannotFit) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_debugmodel");
  c.training.local_batch_size = 4096;  // ~600 GiB of activations: nothing is allocated
  c.dump_folder = fresh_temp_dir("memory_plan_big");
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("the run needs"), std::string::npos) << e;
  EXPECT_NE(e.find("this machine has"), std::string::npos) << e;
}

}  // namespace
}  // namespace titan::train
