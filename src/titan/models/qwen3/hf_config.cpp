#include "titan/models/qwen3/hf_config.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "titan/core/error.h"

namespace titan::qwen3 {
namespace {
constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;
}  // namespace

using nlohmann::json;

Qwen3Args args_from_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  check(exists, path +
                    ": cannot read; model.hf_assets_path must be a Hugging Face model "
                    "directory with config.json");
  // A directory, a FIFO or /dev/zero would fail deep in the stream or never end.
  check(std::filesystem::is_regular_file(path, ec),
        path +
            ": not a regular file; model.hf_assets_path must be a Hugging Face model "
            "directory with a config.json file");
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec && size <= kMaxConfigBytes, path + ": " + std::to_string(size) +
                                            " bytes, too large for a model config.json "
                                            "(at most 16 MiB)");
  std::ifstream f(path);
  check(f.good(), path + ": cannot read");
  json cfg = json::parse(f, nullptr, false);
  check(!cfg.is_discarded() && cfg.is_object(), path + ": not a valid JSON object");
  return args_from_hf_json(cfg, path);
}

// Long because Transformers' config.json has that many fields: one check and one assignment per
// field (dense and MoE), in the order Qwen3Config declares them, each naming the field it refuses.
Qwen3Args args_from_hf_json(const json& cfg, const std::string& where) {
  auto fail = [&](const std::string& field, const std::string& what) {
    throw Error(where + ": field '" + field + "' " + what);
  };
  auto get_int = [&](const char* k) -> int64_t {
    if (!cfg.contains(k) || cfg[k].is_null()) fail(k, "is required but missing");
    if (!cfg[k].is_number_integer()) fail(k, "must be an integer");
    if (cfg[k].is_number_unsigned() &&
        cfg[k].get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(k, "is " + cfg[k].dump() + ", out of range");
    return cfg[k].get<int64_t>();
  };
  auto get_bool = [&](const char* k, bool dflt) {
    if (!cfg.contains(k) || cfg[k].is_null()) return dflt;
    if (!cfg[k].is_boolean()) fail(k, "must be true or false");
    return cfg[k].get<bool>();
  };
  // Which model this is: model_type (what transformers' AutoConfig reads) and/or architectures
  // (a list of class names). Without either the file could be any model; refuse it.
  const bool has_type = cfg.contains("model_type") && !cfg["model_type"].is_null();
  const bool has_arch = cfg.contains("architectures") && !cfg["architectures"].is_null();
  if (!has_type && !has_arch)
    fail("model_type",
         "is missing (and so is 'architectures'); a Qwen3 config.json has \"model_type\": "
         "\"qwen3\" or \"qwen3_moe\"");
  bool moe_arch = false;
  if (has_arch) {
    if (!cfg["architectures"].is_array())
      fail("architectures", "must be a list of class names such as [\"Qwen3ForCausalLM\"], got " +
                                cfg["architectures"].dump());
    bool ok = false;
    for (const auto& a : cfg["architectures"]) {
      ok |= a == "Qwen3ForCausalLM" || a == "Qwen3MoeForCausalLM";
      moe_arch |= a == "Qwen3MoeForCausalLM";
    }
    if (!ok)
      fail("architectures", cfg["architectures"].dump() +
                                " is not supported; titan builds Qwen3ForCausalLM and "
                                "Qwen3MoeForCausalLM from config.json");
  }
  const bool moe_type = has_type ? cfg["model_type"] == "qwen3_moe" : moe_arch;
  if (has_type && cfg["model_type"] != "qwen3" && !moe_type)
    fail("model_type",
         cfg["model_type"].dump() + " is not supported; expected \"qwen3\" or \"qwen3_moe\"");

  Qwen3Args a;
  a.vocab_size = get_int("vocab_size");
  a.dim = get_int("hidden_size");
  a.n_layers = get_int("num_hidden_layers");
  a.n_heads = get_int("num_attention_heads");
  a.n_kv_heads = cfg.contains("num_key_value_heads") && !cfg["num_key_value_heads"].is_null()
                     ? get_int("num_key_value_heads")
                     : a.n_heads;
  // transformers: head_dim = hidden_size // num_attention_heads when absent; check the divisor
  // first (0 would stop the process with SIGFPE).
  if (a.n_heads <= 0)
    fail("num_attention_heads", "must be positive, got " + std::to_string(a.n_heads));
  a.head_dim = cfg.contains("head_dim") && !cfg["head_dim"].is_null() ? get_int("head_dim")
                                                                      : a.dim / a.n_heads;
  a.hidden_dim = get_int("intermediate_size");
  a.max_seq_len =
      cfg.contains("max_position_embeddings") ? get_int("max_position_embeddings") : 32768;
  if (cfg.contains("rms_norm_eps")) {
    if (!cfg["rms_norm_eps"].is_number()) fail("rms_norm_eps", "must be a number");
    a.norm_eps = cfg["rms_norm_eps"].get<float>();
  }
  a.tie_embeddings = get_bool("tie_word_embeddings", false);
  if (get_bool("attention_bias", false))
    fail("attention_bias", "is true; titan's Qwen3 has no attention biases");
  if (get_bool("use_sliding_window", false))
    fail("use_sliding_window", "is true; sliding-window attention is not implemented");
  // transformers 4.56+: one attention kind per layer; titan implements full attention only.
  if (cfg.contains("layer_types") && !cfg["layer_types"].is_null()) {
    const json& lt = cfg["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != a.n_layers)
      fail("layer_types", "must list one attention type per layer (" + std::to_string(a.n_layers) +
                              " for num_hidden_layers)");
    for (size_t l = 0; l < lt.size(); ++l)
      if (lt[l] != "full_attention")
        fail("layer_types", "gives layer " + std::to_string(l) + " " + lt[l].dump() +
                                "; only full_attention is implemented (no sliding window)");
  }
  if (cfg.contains("hidden_act") && cfg["hidden_act"] != "silu")
    fail("hidden_act", cfg["hidden_act"].dump() + " is not supported; only silu");

  // RoPE: legacy top-level rope_theta / rope_scaling, or rope_parameters (transformers 5).
  a.rope_theta = 10000.0;  // transformers' default when no theta is given
  if (cfg.contains("rope_theta") && !cfg["rope_theta"].is_null()) {
    if (!cfg["rope_theta"].is_number()) fail("rope_theta", "must be a number");
    a.rope_theta = cfg["rope_theta"].get<double>();
  }
  auto check_type = [&](const json& rp, const char* field) {
    for (const char* k : {"rope_type", "type"})
      if (rp.contains(k) && rp[k] != "default")
        fail(field,
             "asks for RoPE type " + rp[k].dump() + ", which is not implemented (only default)");
  };
  if (cfg.contains("rope_scaling") && !cfg["rope_scaling"].is_null()) {
    if (!cfg["rope_scaling"].is_object()) fail("rope_scaling", "must be an object or null");
    check_type(cfg["rope_scaling"], "rope_scaling");
  }
  if (cfg.contains("rope_parameters") && !cfg["rope_parameters"].is_null()) {
    const json& rp = cfg["rope_parameters"];
    if (!rp.is_object()) fail("rope_parameters", "must be an object");
    check_type(rp, "rope_parameters");
    if (rp.contains("rope_theta")) {
      if (!rp["rope_theta"].is_number()) fail("rope_parameters.rope_theta", "must be a number");
      a.rope_theta = rp["rope_theta"].get<double>();
    }
  }
  // Qwen3-MoE (qwen3-hf.md §2-§3): sparse layers iff num_experts > 0; the class stores
  // num_experts as num_local_experts, so accept either name.
  if (moe_type) {
    const char* ne = cfg.contains("num_experts") ? "num_experts" : "num_local_experts";
    a.num_experts = cfg.contains(ne) && !cfg[ne].is_null() ? get_int(ne) : 128;
  }
  if (a.num_experts > 0) {
    a.top_k = cfg.contains("num_experts_per_tok") ? get_int("num_experts_per_tok") : 8;
    a.moe_hidden_dim =
        cfg.contains("moe_intermediate_size") ? get_int("moe_intermediate_size") : 768;
    a.norm_topk_prob = get_bool("norm_topk_prob", false);
    a.decoder_sparse_step =
        cfg.contains("decoder_sparse_step") ? get_int("decoder_sparse_step") : 1;
    if (cfg.contains("mlp_only_layers") && !cfg["mlp_only_layers"].is_null()) {
      if (!cfg["mlp_only_layers"].is_array()) fail("mlp_only_layers", "must be a list of layers");
      for (const auto& l : cfg["mlp_only_layers"]) {
        if (!l.is_number_integer()) fail("mlp_only_layers", "must be a list of layer indices");
        a.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
    a.router_aux_loss = get_bool("output_router_logits", false);
    if (cfg.contains("router_aux_loss_coef") && !cfg["router_aux_loss_coef"].is_null()) {
      if (!cfg["router_aux_loss_coef"].is_number())
        fail("router_aux_loss_coef", "must be a number");
      a.router_aux_loss_coef = cfg["router_aux_loss_coef"].get<double>();
    }
    // Hugging Face checkpoints carry no expert bias: aux-loss-free balancing stays off unless
    // model.load_balance_coeff asks for it.
    a.load_balance_coeff = 0;
  }
  try {
    a.validate();
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  return a;
}

json hf_config_json(const Qwen3Args& a, const json& base, const std::string& dtype) {
  json c = base.is_object() ? base : json::object();
  c["architectures"] = {a.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  c["model_type"] = a.is_moe() ? "qwen3_moe" : "qwen3";
  if (a.is_moe()) {
    c.erase("num_local_experts");
    c["num_experts"] = a.num_experts;
    c["num_experts_per_tok"] = a.top_k;
    c["moe_intermediate_size"] = a.moe_hidden_dim;
    c["norm_topk_prob"] = a.norm_topk_prob;
    c["decoder_sparse_step"] = a.decoder_sparse_step;
    c["mlp_only_layers"] = a.mlp_only_layers;
    c["output_router_logits"] = a.router_aux_loss;
    c["router_aux_loss_coef"] = a.router_aux_loss_coef;
  }
  c["vocab_size"] = a.vocab_size;
  c["hidden_size"] = a.dim;
  c["intermediate_size"] = a.hidden_dim;
  c["num_hidden_layers"] = a.n_layers;
  c["num_attention_heads"] = a.n_heads;
  c["num_key_value_heads"] = a.n_kv_heads;
  c["head_dim"] = a.head_dim;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = a.max_seq_len;
  c["rms_norm_eps"] = a.norm_eps;
  c["tie_word_embeddings"] = a.tie_embeddings;
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["use_sliding_window"] = false;
  if (c.contains("layer_types"))  // the source's, one per layer: the layer count may differ
    c["layer_types"] = std::vector<std::string>(static_cast<size_t>(a.n_layers), "full_attention");
  if (!c.contains("initializer_range")) c["initializer_range"] = 0.02;
  if (!c.contains("max_window_layers")) c["max_window_layers"] = a.n_layers;
  // Released configs use top-level rope_theta; transformers 5 writes rope_parameters. Both
  // versions read rope_parameters when present, older ones rope_theta: write both, consistent.
  c["rope_theta"] = a.rope_theta;
  c["rope_scaling"] = nullptr;
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  c["torch_dtype"] = dtype;
  c["dtype"] = dtype;
  c["use_cache"] = true;
  return c;
}

}  // namespace titan::qwen3
