// Training LoRA adapters (models/lora.h) with the trainer: the base stays bitwise unchanged, the
// loss falls, checkpoints hold only the adapters and their AdamW state and resume bitwise, the
// Hugging Face save is a PEFT adapter directory that the real PEFT loads with titan's logits (where
// the tools venv exists), and lora.merge_on_export writes merged weights equal to the adapted
// model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/registry.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace fs = std::filesystem;
namespace {

const std::string kBase = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2";

config::JobConfig lora_job(const std::string& dump) {
  config::JobConfig c;
  c.dump_folder = dump;
  c.model.hf_assets_path = kBase;
  c.checkpoint.initial_load_in_hf = true;
  c.training.local_batch_size = 4;
  c.training.seq_len = 32;
  c.training.steps = 6;
  c.training.mixed_precision_param = "float32";
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 1e-2;
  c.debug.seed = 3;
  c.metrics.enable_jsonl = false;
  c.lora.rank = 4;
  c.lora.alpha = 8;
  return c;
}

// A model for c with B×S microbatches (adapters when c asks for them), no weights loaded.
std::unique_ptr<models::Model> build(const config::JobConfig& c, int64_t B, int64_t S) {
  models::BuildOptions o;
  o.batch = B;
  o.seq_len = S;
  o.log_overrides = false;
  return models::build_model(c, o);
}

std::vector<float> base_weights_on_disk(const config::JobConfig& c) {
  config::JobConfig plain = c;
  plain.lora.rank = 0;
  auto m = build(plain, c.training.local_batch_size, c.training.seq_len);
  ckpt::load_model_weights(*m, kBase, true);
  return {m->store().param_data(), m->store().param_data() + m->num_params()};
}

// Logits of the first rows of the fox documents as tokens (byte ids), [B·S, V].
std::vector<float> logits_of(models::Model& m, int64_t B, int64_t S, std::vector<int32_t>* ids) {
  ids->resize(static_cast<size_t>(B * S));
  std::vector<int32_t> pos(ids->size());
  for (int64_t i = 0; i < B * S; ++i) {
    (*ids)[static_cast<size_t>(i)] = static_cast<int32_t>(32 + (i * 7) % 90);
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i % S);
  }
  std::vector<float> out(static_cast<size_t>(B * S * m.vocab_size()));
  models::Batch b{B, S, ids->data(), nullptr, pos.data()};
  m.forward_logits(b, out.data());
  return out;
}

TEST(LoraTraining, BaseStaysFrozenLossFallsAndCheckpointsResumeBitwise) {
  const std::string dir = titan::testing::fresh_temp_dir("lora_train");
  config::JobConfig c = lora_job(dir + "/whole");
  std::vector<double> whole;
  {
    Trainer t(c, titan::testing::fox_docs());
    ASSERT_NE(t.model().frozen_base(), nullptr);
    for (int i = 0; i < 6; ++i) whole.push_back(t.step().loss);
    models::Model& base = *t.model().frozen_base();
    EXPECT_EQ(std::vector<float>(base.store().param_data(),
                                 base.store().param_data() + base.num_params()),
              base_weights_on_disk(c));  // bitwise: no update reached the base
  }
  EXPECT_LT(whole.back(), whole.front());

  // 3 steps and a checkpoint (interval 3), the process ends; a second run resumes to 6.
  c = lora_job(dir + "/resumed");
  c.checkpoint.enable = true;
  c.checkpoint.interval = 3;
  std::vector<double> resumed;
  {
    Trainer t(c, titan::testing::fox_docs());
    for (int i = 0; i < 3; ++i) t.step();
    t.maybe_checkpoint();
  }
  // The checkpoint holds the adapters only.
  auto weights =
      ckpt::SafetensorsSet::open(dir + "/resumed/checkpoint/step-3/model.safetensors").names();
  ASSERT_FALSE(weights.empty());
  for (const auto& n : weights) EXPECT_NE(n.find(".lora_"), std::string::npos) << n;
  {
    Trainer t(c, titan::testing::fox_docs());
    EXPECT_EQ(t.current_step(), 3);
    for (int i = 3; i < 6; ++i) resumed.push_back(t.step().loss);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], whole[3 + i]) << "step " << 4 + i;
  fs::remove_all(dir);
}

TEST(LoraTraining, HuggingFaceSaveIsAPeftAdapterThatPeftLoads) {
  const std::string dir = titan::testing::fresh_temp_dir("lora_peft");
  config::JobConfig c = lora_job(dir);
  c.training.steps = 3;
  c.checkpoint.enable = true;
  c.checkpoint.last_save_in_hf = true;
  std::vector<float> trained;
  std::vector<int32_t> ids;
  const int64_t B = 2, S = 16;
  {
    Trainer t(c, titan::testing::fox_docs());
    t.train();
    trained = logits_of(t.model(), B, S, &ids);
  }
  const std::string adapter = dir + "/checkpoint/step-3";
  EXPECT_TRUE(fs::exists(adapter + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(adapter + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(adapter + "/model.safetensors"));
  // titan reads it back through lora.adapter_path: the same logits, bitwise.
  config::JobConfig g = lora_job(dir);
  g.lora.rank = 0;
  g.lora.adapter_path = adapter;
  auto m = build(g, B, S);
  ckpt::load_model_weights(*m->frozen_base(), kBase, true);
  ckpt::load_model_weights(*m, adapter, true);
  std::vector<int32_t> ids2;
  EXPECT_EQ(logits_of(*m, B, S, &ids2), trained);

  // The real PEFT loads it onto the transformers base with titan's logits.
  const std::string py = std::string(TITAN_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py)) {
    fs::remove_all(dir);
    GTEST_SKIP() << "no Python environment (tools/setup_venv.sh): skipped the PEFT check";
  }
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  const std::string ref = dir + "/titan_logits.safetensors";
  ckpt::write_file(ref, {{"input_ids", DType::I64, {B, S}, ids64.data()},
                         {"logits", DType::F32, {B, S, m->vocab_size()}, trained.data()}});
  const std::string cmd = py + " " + TITAN_SOURCE_DIR + "/tools/check_peft_adapter.py " + kBase +
                          " " + adapter + " " + ref + " --tol 1e-5 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0) << out;
  std::printf("%s", out.c_str());
  fs::remove_all(dir);
}

TEST(LoraTraining, MergedExportEqualsTheAdaptedModel) {
  const std::string dir = titan::testing::fresh_temp_dir("lora_merge");
  config::JobConfig c = lora_job(dir);
  c.training.steps = 3;
  c.checkpoint.enable = true;
  c.checkpoint.last_save_in_hf = true;
  c.lora.merge_on_export = true;
  std::vector<float> adapted, base_after;
  std::vector<int32_t> ids;
  const int64_t B = 2, S = 16;
  {
    Trainer t(c, titan::testing::fox_docs());
    t.train();
    adapted = logits_of(t.model(), B, S, &ids);
    models::Model& base = *t.model().frozen_base();
    base_after.assign(base.store().param_data(), base.store().param_data() + base.num_params());
  }
  EXPECT_EQ(base_after, base_weights_on_disk(c));  // merging gave the base its bits back
  const std::string out = dir + "/checkpoint/step-3";
  ASSERT_TRUE(fs::exists(out + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/config.json"));
  config::JobConfig plain = lora_job(dir);
  plain.lora.rank = 0;
  plain.model.hf_assets_path = out;
  auto m = build(plain, B, S);
  ckpt::load_model_weights(*m, out, true);
  std::vector<int32_t> ids2;
  const std::vector<float> merged = logits_of(*m, B, S, &ids2);
  double worst = 0;
  for (size_t i = 0; i < merged.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(merged[i] - adapted[i])));
  EXPECT_LE(worst, 1e-5);  // W + s·B·A in fp32 vs the two products: rounding only
  std::printf("merged export vs adapted model: max |Δlogits| = %.3g\n", worst);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace titan::train
