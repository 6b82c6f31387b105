// Checkpoints: exact resume, Hugging Face export/import round trip, and (when the project's
// Python environment exists) loading the export in the real transformers.
#include "titan/checkpoint/checkpointer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/trainer.h"

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 30; ++i) d.push_back("checkpoint test document " + std::to_string(i * 7919));
  return d;
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("titan_ckpt_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

config::JobConfig small(const std::string& dump) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.dump_folder = dump;
  c.training.local_batch_size = 2;
  c.training.seq_len = 32;
  c.training.steps = 4;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 3;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;
  return c;
}

TEST(Checkpointer, ResumeContinuesBitwiseIdentically) {
  const std::string dump = temp_dir("resume");
  std::vector<double> losses;
  {
    train::Trainer t(small(dump), docs());
    for (int i = 0; i < 4; ++i) {
      losses.push_back(t.step().loss);
      t.maybe_checkpoint();
    }
  }
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-2/train_state.json"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-4/optimizer.safetensors"));
  config::JobConfig c = small(dump);
  c.checkpoint.load_step = 2;
  train::Trainer resumed(c, docs());
  EXPECT_EQ(resumed.current_step(), 2);
  EXPECT_EQ(resumed.step().loss, losses[2]);
  EXPECT_EQ(resumed.step().loss, losses[3]);
  c.checkpoint.load_step = 3;
  EXPECT_THROW(train::Trainer(c, docs()), Error);
}

TEST(Checkpointer, KeepLatestKPurgesOlderSteps) {
  const std::string dump = temp_dir("purge");
  config::JobConfig c = small(dump);
  c.training.steps = 8;
  c.checkpoint.interval = 1;
  c.checkpoint.keep_latest_k = 2;
  train::Trainer t(c, docs());
  for (int i = 0; i < 5; ++i) {
    t.step();
    t.maybe_checkpoint();
  }
  EXPECT_FALSE(fs::exists(dump + "/checkpoint/step-3"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-4"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-5"));
}

class HfRoundTrip : public ::testing::TestWithParam<std::string> {};

// Load a transformers-made model, train 3 steps, export in HF format; importing the export gives
// bitwise-identical fp32 parameters; with the Python environment, transformers loads it with no
// missing or unexpected keys and its logits match titan's.
TEST_P(HfRoundTrip, TrainExportImport) {
  const std::string src = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/" + GetParam();
  const std::string dump = temp_dir("hf_" + GetParam());
  config::JobConfig c = small(dump);
  c.model = config::ModelConfig{};
  c.model.hf_assets_path = src;
  c.training.seq_len = 16;
  c.training.steps = 3;
  c.checkpoint.initial_load_in_hf = true;
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.last_save_in_hf = true;
  c.checkpoint.interval = 100;
  train::Trainer t(c, docs());
  // The initial weights are the fixture's.
  SafetensorsSet fixture = SafetensorsSet::open(src);
  std::vector<float> emb(static_cast<size_t>(t.model().param("tok_embeddings.weight").numel));
  fixture.read_f32("model.embed_tokens.weight", t.model().param("tok_embeddings.weight").shape,
                   emb.data());
  EXPECT_EQ(0, std::memcmp(emb.data(), t.model().param_ptr("tok_embeddings.weight"),
                           emb.size() * sizeof(float)));
  for (int i = 0; i < 3; ++i) {
    t.step();
    t.maybe_checkpoint();
  }
  const std::string out = dump + "/checkpoint/step-3";
  ASSERT_TRUE(fs::exists(out + "/config.json"));
  ASSERT_TRUE(fs::exists(out + "/generation_config.json"));
  SafetensorsSet exported = SafetensorsSet::open(out);
  const auto& args = dynamic_cast<qwen3::Qwen3Model&>(t.model()).args();
  if (args.tie_embeddings) {
    EXPECT_EQ(exported.find("lm_head.weight"), nullptr);
  }
  qwen3::Qwen3Model back(args, 1, 16);
  load_model_weights(back, out, true);
  EXPECT_EQ(0, std::memcmp(back.param_data(), t.model().param_data(),
                           static_cast<size_t>(back.num_params()) * sizeof(float)));

  const std::string py = std::string(TITAN_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py))
    GTEST_SKIP() << "no Python environment (tools/setup_venv.sh): skipped the transformers check";
  // titan's logits for the fixture's tokens, then transformers on the export.
  const std::string logits = dump + "/logits.safetensors";
  std::string cmd =
      std::string(TITAN_BINARY) +
      " eval --config qwen3_debugmodel --training.seq_len 16 --model.hf_assets_path " + out +
      " --eval.tokens_path " + src + "/expected.safetensors --eval.logits_out " + logits + " > " +
      dump + "/eval.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  cmd = py + " " + TITAN_SOURCE_DIR + "/tools/check_hf_export.py " + out + " --logits " + logits +
        " --atol 1e-4 > " + dump + "/check.log 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dump + "/check.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << text;
  std::printf("%s", text.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfRoundTrip,
                         ::testing::Values("tied_gqa2", "untied_gqa1", "moe_norm",
                                           "moe_nonorm_dense1"));

}  // namespace
}  // namespace titan::ckpt
