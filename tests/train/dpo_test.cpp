// DPO (train/dpo.h) against the real TRL 1.16 DPOTrainer (tests/fixtures/dpo/loss, made by
// tools/make_dpo_fixtures.py): a tiny fp32 Qwen3 policy and a different reference, four pairs of
// token ids; TRL's per-pair log-probabilities, the batch loss and metrics of each loss type, and
// the gradient of every policy tensor for sigmoid and ipo. Then the trainer: the loss falls and
// the reward accuracy rises on a synthetic preference set, a resume is bitwise, and a damaged
// reference file is refused.
#include "titan/train/dpo.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/models/registry.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

using nlohmann::json;

const std::string kFixture = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/dpo/loss";

std::unique_ptr<models::Model> hf_model(const std::string& dir) {
  config::JobConfig c;
  c.model.hf_assets_path = dir;
  c.model.attn_mask_type = "causal";
  c.training.mixed_precision_param = "float32";
  models::BuildOptions o;
  o.batch = 1;
  o.seq_len = 32;
  o.log_overrides = false;
  auto m = models::build_model(c, o);
  ckpt::load_model_weights(*m, dir, true);
  return m;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

TEST(Dpo, LogpsLossMetricsAndGradientsMatchTrl) {
  std::ifstream f(kFixture + "/expected.json");
  const json fx = json::parse(f);
  auto policy = hf_model(kFixture + "/policy");
  auto reference = hf_model(kFixture + "/ref");
  std::vector<PreferencePair> pairs;
  std::vector<PairLogps> ref;
  double worst_logp = 0;
  for (const json& p : fx.at("pairs")) {
    pairs.push_back({p.at("prompt_input_ids").get<std::vector<int32_t>>(),
                     p.at("chosen_input_ids").get<std::vector<int32_t>>(),
                     p.at("rejected_input_ids").get<std::vector<int32_t>>()});
    const PairLogps pi = pair_logps(*policy, pairs.back());
    const PairLogps r = pair_logps(*reference, pairs.back());
    // fp32 sums of ≤ 8 log-probabilities of magnitude ≤ 10: a few ulps of the sums apart.
    for (const auto& [got, want] :
         {std::pair{pi.chosen, p.at("policy_chosen_logps").get<double>()},
          std::pair{pi.rejected, p.at("policy_rejected_logps").get<double>()},
          std::pair{r.chosen, p.at("ref_chosen_logps").get<double>()},
          std::pair{r.rejected, p.at("ref_rejected_logps").get<double>()}}) {
      EXPECT_LE(rel(got, want), 1e-5) << got << " vs " << want;
      worst_logp = std::max(worst_logp, rel(got, want));
    }
    ref.push_back(r);
  }
  for (const json& run : fx.at("runs")) {
    config::DpoConfig c;
    c.loss_type = run.at("loss_type").get<std::string>();
    c.beta = run.at("beta").get<double>();
    c.label_smoothing = run.at("label_smoothing").get<double>();
    policy->zero_grad();
    const DpoSums s = dpo_forward_backward(*policy, c, pairs, ref, 4);
    const double loss = s.loss / 4;
    const double want = run.at("loss").get<double>();
    EXPECT_LE(rel(loss, want), 1e-5) << c.loss_type << ": " << loss << " vs " << want;
    for (const auto& [name, v] : s.metrics()) {
      const double w = run.at("metrics").at(name).get<double>();
      // the margins are differences of rewards ~0.1: absolute, at the rewards' precision
      EXPECT_NEAR(v, w, 1e-5 * std::max(1.0, std::fabs(w))) << c.loss_type << " " << name;
    }
    const std::string grads = kFixture + "/grads_" + c.loss_type + ".safetensors";
    if (!std::filesystem::exists(grads)) continue;
    auto exp = ckpt::SafetensorsSet::open(grads);
    double worst = 0;
    int tensors = 0;
    for (const auto& t : policy->hf().hf_tensors()) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      std::vector<float> g(static_cast<size_t>(n));
      exp.read_f32(t.key, t.shape, g.data());
      const double r = titan::testing::relative_l2(policy->store().grads() + t.offset, g.data(), n);
      EXPECT_LE(r, 1e-4) << c.loss_type << " " << t.key;
      worst = std::max(worst, r);
      ++tensors;
    }
    EXPECT_EQ(tensors, static_cast<int>(exp.names().size()));
    std::printf("[ %s ] loss %.8f vs TRL %.8f; %d gradients, worst ||Δ||/||TRL|| = %.3g\n",
                c.loss_type.c_str(), loss, want, tensors, worst);
  }
  std::printf("log-probabilities: worst relative difference to TRL %.3g\n", worst_logp);
}

TEST(Dpo, PairOrderIsTheFileFirstThenReshuffledEachEpoch) {
  PairOrder plain(5, false, 42), shuffled(5, true, 42), again(5, true, 42);
  std::vector<int64_t> e1;
  for (int64_t g = 0; g < 5; ++g) {
    EXPECT_EQ(plain.at(g), g);
    EXPECT_EQ(shuffled.at(g), g);  // epoch 0: the file's order
    EXPECT_EQ(plain.at(g + 5), g);
  }
  for (int64_t g = 5; g < 10; ++g) e1.push_back(shuffled.at(g));
  std::vector<int64_t> sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4}));  // a permutation
  EXPECT_NE(e1, sorted);
  for (int64_t g = 5; g < 10; ++g) EXPECT_EQ(again.at(g), e1[static_cast<size_t>(g - 5)]);
  EXPECT_EQ(shuffled.at(2), 2);  // back to epoch 0
}

// A synthetic preference set a tiny model can learn: the chosen completion repeats the prompt's
// letter, the rejected one does not.
std::string write_pairs(const std::string& dir, int n) {
  const std::string path = dir + "/pairs.jsonl";
  std::ofstream o(path);
  for (int i = 0; i < n; ++i) {
    const char a = static_cast<char>('a' + i % 13), b = static_cast<char>('n' + i % 13);
    o << json{{"prompt", std::string("say ") + a + ":"},
              {"chosen", std::string(" ") + a + a + a},
              {"rejected", std::string(" ") + b + b}}
             .dump()
      << "\n";
  }
  return path;
}

config::JobConfig dpo_job(const std::string& dir) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.dump_folder = dir + "/out";
  c.dpo.enable = true;
  c.dataloader.dataset = "jsonl";
  c.dataloader.dataset_path = write_pairs(dir, 32);
  c.training.local_batch_size = 8;
  c.training.seq_len = 16;
  c.training.steps = 30;
  c.training.mixed_precision_param = "float32";
  c.optimizer.lr = 3e-3;
  c.lr_scheduler.warmup_steps = 2;
  c.debug.seed = 7;
  return c;
}

TEST(Dpo, TrainerLearnsThePreferences) {
  const std::string dir = titan::testing::fresh_temp_dir("dpo_learn");
  Trainer t(dpo_job(dir));
  std::vector<StepResult> rs;
  for (int i = 0; i < 30; ++i) rs.push_back(t.step());
  EXPECT_NEAR(rs[0].loss, std::log(2.0), 1e-6);  // the policy is the reference at step 1
  const auto metric = [](const StepResult& r, const std::string& name) {
    for (const auto& [n, v] : r.objective)
      if (n == name) return v;
    return std::nan("");
  };
  const double acc = metric(rs.back(), "rewards/accuracies");
  std::printf("DPO 30 steps: loss %.4f -> %.4f, rewards/accuracies %.3f, margins %.4f\n",
              rs[0].loss, rs.back().loss, acc, metric(rs.back(), "rewards/margins"));
  EXPECT_LT(rs.back().loss, 0.5 * rs[0].loss);
  EXPECT_GT(acc, 0.9);
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/dpo_reference/logps.bin"));
}

TEST(Dpo, ResumeIsBitwiseAndADamagedReferenceIsRefused) {
  const std::string dir = titan::testing::fresh_temp_dir("dpo_resume");
  config::JobConfig c = dpo_job(dir);
  c.training.steps = 4;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  std::vector<double> whole;
  {
    config::JobConfig w = c;
    w.dump_folder = dir + "/whole";
    w.checkpoint.enable = false;
    Trainer t(w);
    for (int i = 0; i < 4; ++i) whole.push_back(t.step().loss);
  }
  {
    Trainer t(c);
    t.step();
    t.step();
    t.maybe_checkpoint();
  }
  Trainer t(c);
  ASSERT_EQ(t.current_step(), 2);
  EXPECT_EQ(t.step().loss, whole[2]);
  EXPECT_EQ(t.step().loss, whole[3]);

  const std::string ref = c.dump_folder + "/dpo_reference/logps.bin";
  std::filesystem::resize_file(ref, std::filesystem::file_size(ref) - 8);
  const std::string e = titan::testing::error_of([&] { Trainer again(c); });
  EXPECT_NE(e.find(ref), std::string::npos) << e;
  EXPECT_NE(e.find("start the run again from step 0"), std::string::npos) << e;
}

// LoRA: the reference is the base with the adapters off (no reference file, no second copy).
// The adapters start at B = 0, so at step 1 the policy is the reference; the loss then falls.
// The same run with bf16 mixed precision also starts at log 2 and falls.
TEST(Dpo, LoraReferenceIsTheBaseWithoutItsAdapters) {
  for (const char* precision : {"float32", "bfloat16"}) {
    const std::string dir = titan::testing::fresh_temp_dir(std::string("dpo_lora_") + precision);
    config::JobConfig c = dpo_job(dir);
    c.model = config::JobConfig{}.model;
    c.model.hf_assets_path = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2";
    c.checkpoint.initial_load_in_hf = true;
    c.dataloader.tokenizer = "byte";
    c.training.mixed_precision_param = precision;
    c.training.steps = 12;
    c.lora.rank = 4;
    c.lora.alpha = 8;
    c.optimizer.lr = 1e-2;
    Trainer t(c);
    ASSERT_NE(t.model().frozen_base(), nullptr);
    const double first = t.step().loss;
    double last = first;
    for (int i = 1; i < 12; ++i) last = t.step().loss;
    EXPECT_NEAR(first, std::log(2.0), 1e-6) << precision;
    EXPECT_LT(last, 0.9 * first) << precision;
    EXPECT_FALSE(std::filesystem::exists(dir + "/out/dpo_reference")) << precision;
    std::printf("DPO + LoRA (%s): loss %.5f -> %.5f in 12 steps\n", precision, first, last);
  }
}

}  // namespace
}  // namespace titan::train
