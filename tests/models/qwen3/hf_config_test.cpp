// config.json -> Qwen3Args, and the titan <-> Hugging Face key map.
#include "titan/models/qwen3/hf_config.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/state_dict_adapter.h"

namespace titan::qwen3 {
namespace {

using nlohmann::json;

json base() {
  return json::parse(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": true,
    "attention_bias": false, "use_sliding_window": false, "torch_dtype": "bfloat16",
    "hidden_act": "silu"})");
}

std::string error_of(const json& j) {
  try {
    args_from_hf_json(j, "X/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, ReadsQwen3_0_6B) {
  Qwen3Args a = args_from_hf_json(base(), "x");
  EXPECT_EQ(a.dim, 1024);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_EQ(a.n_kv_heads, 8);
  EXPECT_EQ(a.max_seq_len, 40960);
  EXPECT_DOUBLE_EQ(a.rope_theta, 1e6);
  EXPECT_TRUE(a.tie_embeddings);
}

TEST(HfConfig, AcceptsRopeParametersAndMissingOptionalFields) {
  json j = base();
  j.erase("rope_theta");
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j.erase("tie_word_embeddings");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  Qwen3Args a = args_from_hf_json(j, "x");
  EXPECT_DOUBLE_EQ(a.rope_theta, 5e6);
  EXPECT_EQ(a.head_dim, 64);    // hidden / heads
  EXPECT_EQ(a.n_kv_heads, 16);  // = heads
  EXPECT_FALSE(a.tie_embeddings);
  j.erase("rope_parameters");
  EXPECT_DOUBLE_EQ(args_from_hf_json(j, "x").rope_theta, 10000.0);  // transformers' default
}

TEST(HfConfig, RefusesWhatItCannotBuild) {
  json j = base();
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(error_of(j).find("'architectures'"), std::string::npos);
  j = base();
  j["model_type"] = "mixtral";
  EXPECT_NE(error_of(j).find("'model_type'"), std::string::npos);
  j = base();
  j["model_type"] = "qwen3_moe";
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(error_of(j).find("model.top_k (5) must not exceed model.num_experts (4)"),
            std::string::npos);
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = "1";
  EXPECT_NE(error_of(j).find("'mlp_only_layers' must be a list"), std::string::npos);
  j = base();
  j["attention_bias"] = true;
  EXPECT_NE(error_of(j).find("'attention_bias'"), std::string::npos);
  j = base();
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of(j).find("'use_sliding_window'"), std::string::npos);
  j = base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("'rope_scaling'"), std::string::npos);
  j = base();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("X/config.json: field 'hidden_size' is required"), std::string::npos);
  // Transformers' per-layer attention kinds: only full attention, one entry per layer.
  for (const json& lt : {json::array({"sliding_attention"}), json("full_attention"),
                         json::array({"full_attention", "full_attention"})}) {
    j = base();
    j["num_hidden_layers"] = 1;
    j["layer_types"] = lt;
    EXPECT_NE(error_of(j).find("field 'layer_types'"), std::string::npos) << lt.dump();
  }
  j = base();
  j["num_hidden_layers"] = 2;
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(error_of(j), "");
  j = base();
  j["num_hidden_layers"] = "28";
  EXPECT_NE(error_of(j).find("'num_hidden_layers' must be an integer"), std::string::npos);
}

// A config.json with num_attention_heads 0 and no head_dim divided by zero (SIGFPE, no message).
TEST(HfConfig, ZeroHeadsWithoutHeadDimIsNamed) {
  json j = base();
  j.erase("head_dim");
  j["num_attention_heads"] = 0;
  EXPECT_NE(error_of(j).find("X/config.json: field 'num_attention_heads' must be positive, got 0"),
            std::string::npos)
      << error_of(j);
  j["num_attention_heads"] = -3;
  EXPECT_NE(error_of(j).find("'num_attention_heads' must be positive, got -3"), std::string::npos);
}

// Neither model_type nor architectures (or architectures as a string) loaded as Qwen3.
TEST(HfConfig, NeedsModelTypeOrArchitecturesList) {
  json j = base();
  j.erase("model_type");
  j.erase("architectures");
  EXPECT_NE(error_of(j).find("X/config.json: field 'model_type' is missing (and so is "
                             "'architectures')"),
            std::string::npos)
      << error_of(j);
  j["architectures"] = "Qwen3ForCausalLM";
  EXPECT_NE(error_of(j).find("field 'architectures' must be a list"), std::string::npos)
      << error_of(j);
  j["architectures"] = {"Qwen3ForCausalLM"};  // either one is enough
  EXPECT_EQ(error_of(j), "");
  j = base();
  j.erase("architectures");
  EXPECT_EQ(error_of(j), "");
  // Only architectures naming the MoE class: read as MoE (num_experts is not ignored).
  j = base();
  j.erase("model_type");
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  EXPECT_EQ(args_from_hf_json(j, "x").num_experts, 4);
}

// vocab_size 2^64-1 was read as -1 ("must be positive, got -1"); 1e12 allocated until bad_alloc.
TEST(HfConfig, OutOfRangeSizesAreNamed) {
  json j = base();
  j["vocab_size"] = 18446744073709551615ull;
  EXPECT_NE(error_of(j).find("field 'vocab_size' is 18446744073709551615, out of range"),
            std::string::npos)
      << error_of(j);
  j["vocab_size"] = 1000000000000;
  EXPECT_NE(error_of(j).find("X/config.json: model.vocab_size 1000000000000 is out of range"),
            std::string::npos)
      << error_of(j);
  j = base();
  j["intermediate_size"] = int64_t{1} << 62;
  EXPECT_NE(error_of(j).find("overflow a 64-bit parameter count"), std::string::npos)
      << error_of(j);
}

// config.json being a directory threw basic_filebuf::underflow (an internal error).
TEST(HfConfig, ConfigJsonMustBeARegularFile) {
  const std::string d = titan::testing::fresh_temp_dir("hf_dir_config");
  std::filesystem::create_directories(d + "/config.json");
  const std::string msg = titan::testing::error_of([&] { args_from_hf_config(d); });
  EXPECT_NE(msg.find(d + "/config.json: not a regular file"), std::string::npos) << msg;
}

TEST(HfConfig, WrittenConfigReadsBack) {
  Qwen3Args a = args_from_hf_json(base(), "x");
  a.n_layers = 2;
  json out = hf_config_json(a, base(), "float32");
  Qwen3Args b = args_from_hf_json(out, "y");
  EXPECT_EQ(b.n_layers, 2);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_DOUBLE_EQ(b.rope_theta, a.rope_theta);
  EXPECT_EQ(out["torch_dtype"], "float32");
}

TEST(StateDictAdapter, KeyMapBothWays) {
  Qwen3Args a = args_from_hf_json(base(), "x");
  a.n_layers = 2;
  a.vocab_size = 300;
  a.dim = 64;
  a.hidden_dim = 96;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.max_seq_len = 64;
  Qwen3Model m(a, 1, 8);
  for (const auto& p : m.params()) EXPECT_EQ(from_hf_key(to_hf_key(p.fqn)), p.fqn);
  EXPECT_EQ(to_hf_key("layers.1.feed_forward.w1.weight"), "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(to_hf_key("layers.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(from_hf_key("model.layers.0.self_attn.rotary_emb.inv_freq"), "");
  EXPECT_THROW(to_hf_key("layers.0.attention.wqkv.weight"), Error);
}

}  // namespace
}  // namespace titan::qwen3
