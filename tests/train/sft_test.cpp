// Supervised fine-tuning end to end: a reduced qwen3_debugmodel trained a few dozen steps on a
// small chat file (conversations built at test time from the speeches of the public-domain
// tinyshakespeare asset) with the byte tokenizer; the loss, taken on the assistant turns only,
// falls, and counts fewer tokens than the rows hold (train_on_prompt: all of them); rows one
// conversation each, and the validator on chat data.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

// n conversations: a speech as the user turn, the next speech as the assistant's answer, every
// third with a system message naming the answering speaker.
std::string write_chat_file(const std::string& dir, int n) {
  std::ifstream f(titan::testing::asset("datasets/tinyshakespeare.txt"));
  std::vector<std::pair<std::string, std::string>> speeches;  // speaker, text
  std::string line, speaker, text;
  while (std::getline(f, line) && static_cast<int>(speeches.size()) <= n) {
    if (line.empty()) {
      if (!speaker.empty()) speeches.emplace_back(speaker, text);
      speaker.clear();
      text.clear();
    } else if (speaker.empty()) {
      speaker = line.substr(0, line.size() - 1);  // "First Citizen:"
    } else {
      text += (text.empty() ? "" : "\n") + line;
    }
  }
  const std::string path = dir + "/shakespeare_chat.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    nlohmann::json m = nlohmann::json::array();
    if (i % 3 == 0)
      m.push_back({{"role", "system"}, {"content", "You are " + speeches[i + 1].first + "."}});
    m.push_back({{"role", "user"}, {"content", speeches[i].second}});
    m.push_back({{"role", "assistant"}, {"content", speeches[i + 1].second}});
    out << nlohmann::json{{"messages", m}}.dump() << "\n";
  }
  return path;
}

config::JobConfig sft_job(const std::string& dir) {
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("qwen3_debugmodel");
  c.model.n_layers = 2;
  c.model.hidden_dim = 256;
  c.training.local_batch_size = 2;
  c.training.seq_len = 256;
  c.training.steps = 30;
  c.metrics.peak_flops = 1e12;  // no GEMM probe at start
  c.optimizer.lr = 3e-3;
  c.lr_scheduler.warmup_steps = 2;
  c.metrics.enable_jsonl = false;
  c.dump_folder = dir + "/out";
  c.debug.seed = 3;
  c.dataloader.dataset = "chat";
  c.dataloader.dataset_path = write_chat_file(dir, 40);
  c.dataloader.tokenizer = "byte";
  return c;
}

TEST(Sft, AssistantOnlyLossFalls) {
  const std::string dir = titan::testing::fresh_temp_dir("sft_run");
  const config::JobConfig c = sft_job(dir);
  Trainer t(c);
  const int64_t row_tokens = c.training.local_batch_size * c.training.seq_len;
  std::vector<double> loss;
  for (int i = 0; i < c.training.steps; ++i) {
    const StepResult r = t.step();
    EXPECT_GT(r.valid_tokens, 0);
    EXPECT_LT(r.valid_tokens, row_tokens) << "the prompt tokens carry no loss";
    loss.push_back(r.loss);
  }
  const double first = (loss[0] + loss[1] + loss[2]) / 3;
  const double last = (loss[loss.size() - 1] + loss[loss.size() - 2] + loss[loss.size() - 3]) / 3;
  std::printf("assistant-only loss: %.4f (steps 1-3) -> %.4f (last 3 of %zu)\n", first, last,
              loss.size());
  EXPECT_LT(last, 0.6 * first);
}

TEST(Sft, TrainOnPromptTakesTheLossOnEveryTokenAndUnpackedRowsPad) {
  const std::string dir = titan::testing::fresh_temp_dir("sft_flags");
  config::JobConfig c = sft_job(dir);
  c.sft.train_on_prompt = true;
  c.sft.packing_strategy = "wrapped";  // rows cut from the stream: no padding
  {
    Trainer t(c);
    EXPECT_EQ(t.step().valid_tokens, c.training.local_batch_size * c.training.seq_len);
  }
  c.sft.train_on_prompt = false;
  c.sft.packing = false;
  c.validator.enable = true;  // the validator reads chat files the same way
  c.validator.dataset_path = c.dataloader.dataset_path;
  c.validator.steps = 2;
  Trainer t(c);
  const StepResult r = t.step();
  EXPECT_GT(r.valid_tokens, 0);
  EXPECT_LT(r.valid_tokens, c.training.local_batch_size * c.training.seq_len);
  const ValidationResult v = t.validate();
  EXPECT_EQ(v.batches, 2);
  EXPECT_GT(v.tokens, 0);
  EXPECT_LT(v.tokens, 2 * c.training.local_batch_size * c.training.seq_len);
  EXPECT_TRUE(std::isfinite(v.loss));
}

}  // namespace
}  // namespace titan::train
