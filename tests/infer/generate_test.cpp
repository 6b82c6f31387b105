// titan generate against the real transformers (fixtures of tools/make_generate_fixtures.py in
// tests/fixtures/generate):
// - greedy generation (fp32) of 32 tokens from prompts of 1, 5 and 12 tokens on the HF fixtures
// (dense
//   tied/untied, MoE) gives exactly the ids of transformers' generate(do_sample=False);
// - the logits warpers (temperature, top-k, top-p in generate's order) leave exactly what
//   transformers' warpers leave on fixed logits with ties (finite values within 1e-5 relative:
//   one fp32 division on both sides);
// - sampling with a seed is reproducible;
// - bad input: one titan::Error line each.
#include "titan/infer/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/config/builtin_configs.h"
#include "titan/core/error.h"
#include "titan/infer/sampling.h"
#include "titan/models/registry.h"

namespace titan::infer {
namespace {

using nlohmann::json;

json fixture(const std::string& name) {
  std::ifstream f(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/generate/" + name);
  return json::parse(f);
}

config::JobConfig fixture_config(const std::string& model) {
  config::register_builtin_configs();
  return config::build_job_config(
      "qwen3_debugmodel",
      {"--model.hf_assets_path", std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/" + model,
       "--dataloader.tokenizer", testing::asset("tokenizers/qwen3"),
       "--training.mixed_precision_param", "float32"},
      validate_generate_config);
}

std::string write_prompts(const std::string& dir, const std::vector<std::vector<int32_t>>& ids) {
  const std::string path = dir + "/prompts.jsonl";
  std::ofstream f(path);
  for (const auto& p : ids) f << json{{"ids", p}}.dump() << "\n";
  return path;
}

TEST(Generate, GreedyMatchesTransformers) {
  const json g = fixture("greedy.json");
  const std::string dir = testing::fresh_temp_dir("generate_greedy");
  for (const auto& [model, cases] : g["models"].items()) {
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& c : cases) prompts.push_back(c["prompt"].get<std::vector<int32_t>>());
    GenerateOptions o;
    o.prompts_file = write_prompts(dir, prompts);
    o.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    o.greedy = true;
    o.ignore_eos = true;
    o.quiet = true;
    const GenerateResult r = generate(fixture_config(model), o);
    ASSERT_EQ(r.completions.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(r.completions[i].ids, cases[i]["generated"].get<std::vector<int32_t>>())
          << model << " prompt " << i;
      EXPECT_EQ(r.completions[i].finish, "length");
    }
  }
}

// With LoRA adapters (lora.adapter_path, tests/fixtures/lora): greedy ids equal
// PeftModel.generate(do_sample=False) on the adapted model.
TEST(Generate, GreedyWithLoraAdapterMatchesPeft) {
  const std::string dir = testing::fresh_temp_dir("generate_lora");
  for (const std::string model : {"tied_gqa2", "moe_nonorm_dense1"}) {
    const std::string lora = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/lora/" + model;
    auto exp = ckpt::SafetensorsSet::open(lora + "/expected.safetensors");
    auto ints = [&](const std::string& name) {
      const ckpt::TensorView* t = exp.find(name);
      std::vector<int32_t> v(static_cast<size_t>(t->numel()));
      for (int64_t i = 0; i < t->numel(); ++i) {
        int64_t x;
        std::memcpy(&x, t->data + 8 * i, 8);
        v[static_cast<size_t>(i)] = static_cast<int32_t>(x);
      }
      return v;
    };
    const std::vector<int32_t> want = ints("greedy_generated");
    GenerateOptions o;
    o.prompts_file = write_prompts(dir, {ints("greedy_prompt")});
    o.max_new_tokens = static_cast<int64_t>(want.size());
    o.greedy = true;
    o.ignore_eos = true;
    o.quiet = true;
    config::JobConfig c = fixture_config(model);
    c.lora.adapter_path = lora;
    const GenerateResult r = generate(c, o);
    ASSERT_EQ(r.completions.size(), 1u);
    EXPECT_EQ(r.completions[0].ids, want) << model;
  }
}

TEST(Generate, WarpersMatchTransformers) {
  const json w = fixture("warpers.json");
  // Top-p cases use logits without ties (which of equal logits torch.sort puts last is not
  // specified); the others rounded logits with ties (top-k keeps every tie).
  const auto ties = w["logits"].get<std::vector<std::vector<float>>>();
  const auto distinct = w["logits_distinct"].get<std::vector<std::vector<float>>>();
  int64_t removed = 0;
  for (const auto& c : w["cases"]) {
    Sampling s;
    s.greedy = false;
    s.temperature = c["temperature"].get<double>();
    s.top_k = c["top_k"].get<int64_t>();
    s.top_p = c["top_p"].get<double>();
    const auto& rows = s.top_p < 1 ? distinct : ties;
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> x = rows[r];
      warp_logits(x.data(), std::ssize(x), s);
      const json& want = c["warped"][r];
      for (size_t i = 0; i < x.size(); ++i) {
        if (want[i].is_null()) {
          EXPECT_EQ(x[i], -std::numeric_limits<float>::infinity()) << c.dump() << " row " << r;
          ++removed;
        } else {
          EXPECT_NEAR(x[i], want[i].get<float>(), 1e-5 * std::fabs(want[i].get<float>()) + 1e-7)
              << c.dump() << " row " << r << " token " << i;
        }
      }
    }
  }
  EXPECT_GT(removed, 0);
}

TEST(Generate, SamplingIsReproducibleForASeed) {
  const std::string dir = testing::fresh_temp_dir("generate_sample");
  GenerateOptions o;
  o.prompts_file = write_prompts(dir, {{1, 2, 3}, {4}});
  o.max_new_tokens = 12;
  o.temperature = 1.0;
  o.top_k = 50;
  o.quiet = true;
  o.ignore_eos = true;
  const config::JobConfig cfg = fixture_config("tied_gqa2");
  o.seed = 5;
  const GenerateResult a = generate(cfg, o), b = generate(cfg, o);
  o.seed = 6;
  const GenerateResult c = generate(cfg, o);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a.completions[i].ids, b.completions[i].ids);
    EXPECT_EQ(a.completions[i].ids.size(), 12u);
  }
  EXPECT_NE(a.completions[0].ids, c.completions[0].ids);
}

TEST(Generate, BadInputIsOneClearError) {
  auto flags_error = [](std::vector<std::string> args) {
    try {
      take_generate_flags(args);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(flags_error({"--prompt", "x", "--top_p", "0"}).find("--top_p must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(flags_error({"--prompt", "x", "--top_p", "1.5"}).find("--top_p"), std::string::npos);
  EXPECT_NE(flags_error({"--prompt", "x", "--temperature", "-1"}).find("--temperature must be"),
            std::string::npos);
  EXPECT_NE(flags_error({"--model.dim", "8"}).find("exactly one of --prompt"), std::string::npos);
  EXPECT_NE(flags_error({"--prompt", "x", "--max_new_tokens", "abc"}).find("integer"),
            std::string::npos);
  std::vector<std::string> rest = {"--prompt", "hi", "--model.dim", "8", "--greedy"};
  const GenerateOptions o = take_generate_flags(rest);
  EXPECT_EQ(rest, (std::vector<std::string>{"--model.dim", "8"}));
  EXPECT_TRUE(o.greedy);

  auto gen_error = [](const config::JobConfig& cfg, GenerateOptions o) {
    o.quiet = true;
    try {
      generate(cfg, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GenerateOptions empty;
  empty.prompt = "";
  EXPECT_NE(gen_error(fixture_config("tied_gqa2"), empty).find("prompt 0 is empty"),
            std::string::npos);
  GenerateOptions longer;  // the fixtures' context is 128 positions
  longer.prompt = "hello";
  longer.max_new_tokens = 200;
  EXPECT_NE(gen_error(fixture_config("tied_gqa2"), longer).find("does not fit the model"),
            std::string::npos);
  config::JobConfig no_tok = fixture_config("tied_gqa2");
  no_tok.dataloader.tokenizer = "auto";  // the fixture directory has no tokenizer.json
  EXPECT_NE(gen_error(no_tok, longer).find("no tokenizer"), std::string::npos);
  // generation_config.json's fields, checked as they are read (the file and field named).
  const std::string bad = testing::fresh_temp_dir("generate_bad_gen") + "/m";
  for (const auto& [field, value, says] :
       {std::tuple{"eos_token_id", json(99999), "'eos_token_id' 99999 is outside the model's"},
        {"eos_token_id", json::array({1, -3}), "'eos_token_id' -3 is outside"},
        {"eos_token_id", json("x"), "'eos_token_id' must be a token id"},
        {"temperature", json(-1.0), "'temperature' must not be negative"},
        {"top_p", json(2.0), "'top_p' must be in (0, 1]"},
        {"top_p", json(0), "'top_p' must be in (0, 1]"},
        {"top_k", json(-5), "'top_k' must be a whole number"},
        {"do_sample", json("yes"), "'do_sample' must be true or false"}}) {
    std::filesystem::remove_all(bad);
    std::filesystem::copy(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2", bad);
    json g = {{field, value}};
    std::ofstream(bad + "/generation_config.json") << g.dump();
    config::JobConfig c = fixture_config("tied_gqa2");
    c.model.hf_assets_path = bad;
    GenerateOptions hi;  // ids within the fixture's vocabulary of 1000
    hi.prompts_file = write_prompts(std::filesystem::path(bad).parent_path(), {{1, 2, 3}});
    hi.max_new_tokens = 2;
    const std::string e = gen_error(c, hi);
    EXPECT_NE(e.find(bad + "/generation_config.json: field " + says), std::string::npos) << e;
  }
  config::JobConfig no_weights = fixture_config("tied_gqa2");
  no_weights.model.hf_assets_path.clear();
  EXPECT_NE(gen_error(no_weights, longer).find("needs weights"), std::string::npos);
}

}  // namespace
}  // namespace titan::infer
