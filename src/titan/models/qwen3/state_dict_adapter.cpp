#include "titan/models/qwen3/state_dict_adapter.h"

#include <map>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"

namespace titan::qwen3 {
namespace {

// Per-layer suffixes: titan -> HF.
const std::vector<std::pair<std::string, std::string>>& layer_map() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_norm.weight"},
      {"attention.k_norm.weight", "self_attn.k_norm.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
  };
  return m;
}

// "PREFIX<digits>.REST" -> {digits, REST}; empty when the key has another form.
std::pair<std::string, std::string> split_layer(const std::string& key, const std::string& prefix) {
  if (key.rfind(prefix, 0) != 0) return {};
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return {};
  std::string idx = key.substr(prefix.size(), dot - prefix.size());
  if (idx.find_first_not_of("0123456789") != std::string::npos) return {};
  return {idx, key.substr(dot + 1)};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

std::string to_hf_key(const std::string& fqn) {
  if (fqn == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (fqn == "norm.weight") return "model.norm.weight";
  if (fqn == "lm_head.weight") return "lm_head.weight";
  auto [idx, rest] = split_layer(fqn, "layers.");
  if (!idx.empty())
    for (const auto& [t, h] : layer_map())
      if (rest == t) return "model.layers." + idx + "." + h;
  throw Error("no Hugging Face key for titan parameter '" + fqn + "'");
}

std::string from_hf_key(const std::string& key) {
  if (key == "model.embed_tokens.weight") return "tok_embeddings.weight";
  if (key == "model.norm.weight") return "norm.weight";
  if (key == "lm_head.weight") return "lm_head.weight";
  auto [idx, rest] = split_layer(key, "model.layers.");
  if (!idx.empty())
    for (const auto& [t, h] : layer_map())
      if (rest == h) return "layers." + idx + "." + t;
  return "";
}

void load_hf_weights(Qwen3Model& model, const ckpt::SafetensorsSet& set, const std::string& where) {
  std::vector<std::string> missing, bad_shape, unexpected;
  std::map<std::string, const ParamInfo*> wanted;  // HF key -> parameter
  for (const auto& p : model.params())
    if (!p.alias) wanted[to_hf_key(p.fqn)] = &p;
  for (const auto& [key, p] : wanted) {
    const ckpt::TensorView* t = set.find(key);
    if (!t) {
      missing.push_back(key);
      continue;
    }
    if (t->shape != p->shape) {
      bad_shape.push_back(key + " " + shape_str(t->shape) + " (expected " + shape_str(p->shape) +
                          ")");
      continue;
    }
  }
  for (const auto& key : set.names()) {
    if (wanted.count(key)) continue;
    if (key == "lm_head.weight" && model.args().tie_embeddings) continue;  // tied: optional
    if (key.find("rotary_emb.inv_freq") != std::string::npos) continue;    // non-persistent buffer
    unexpected.push_back(key);
  }
  if (!missing.empty() || !bad_shape.empty() || !unexpected.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string r;
      for (size_t i = 0; i < v.size() && i < 8; ++i) r += (i ? ", " : "") + v[i];
      if (v.size() > 8) r += ", ... (" + std::to_string(v.size()) + " in all)";
      return r;
    };
    std::string msg = where + ": checkpoint does not match the model:";
    if (!missing.empty()) msg += " missing keys: " + join(missing) + ";";
    if (!bad_shape.empty()) msg += " wrong shapes: " + join(bad_shape) + ";";
    if (!unexpected.empty()) msg += " unexpected keys: " + join(unexpected) + ";";
    throw Error(msg + " check that config.json and the weights belong together");
  }
  for (const auto& [key, p] : wanted) set.read_f32(key, p->shape, model.param_data() + p->offset);
}

}  // namespace titan::qwen3
