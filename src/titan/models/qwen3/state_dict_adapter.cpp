#include "titan/models/qwen3/state_dict_adapter.h"

#include <algorithm>
#include <map>
#include <set>

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
      {"moe.router.gate.weight", "mlp.gate.weight"},
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

std::vector<HfTensor> hf_tensors(const Qwen3Model& model) {
  std::vector<HfTensor> out;
  static const std::vector<std::pair<std::string, std::string>> experts = {
      {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}};
  for (const auto& p : model.params()) {
    if (p.alias) continue;
    auto [idx, rest] = split_layer(p.fqn, "layers.");
    if (!idx.empty() && rest.rfind("moe.experts.", 0) == 0) {
      const std::string w = rest.substr(12);
      for (const auto& [t, h] : experts) {
        if (w != t) continue;
        const int64_t E = p.shape[0], per = p.numel / E;
        for (int64_t e = 0; e < E; ++e)
          out.push_back(
              {"model.layers." + idx + ".mlp.experts." + std::to_string(e) + "." + h + ".weight",
               {p.shape[1], p.shape[2]},
               p.offset + e * per,
               p.fqn});
      }
      continue;
    }
    out.push_back({to_hf_key(p.fqn), p.shape, p.offset, p.fqn});
  }
  return out;
}

namespace {
// Reads the fused on-disk experts of MoE layers that have them (save_original_format=False):
// gate_up_proj [E,2F,D] -> w1 = rows [0,F), w3 = rows [F,2F); down_proj [E,D,F] -> w2. Returns the
// Elements [from, from + n) of tensor `key` into the flat parameters at [to, to + n): all of them,
// or with `only` just the parts within those ranges.
void read_into(Qwen3Model& model, const TensorSource& set, const std::string& key,
               const std::vector<int64_t>& shape, int64_t from, int64_t n, int64_t to,
               const std::vector<models::FlatRange>* only) {
  float* P = model.param_data();
  if (!only) {
    set.read_f32_range(key, shape, from, from + n, P + to);
    return;
  }
  for (const auto& r : *only) {
    const int64_t lo = std::max(r.begin, to), hi = std::min(r.begin + r.len, to + n);
    if (lo < hi) set.read_f32_range(key, shape, from + (lo - to), from + (hi - to), P + lo);
  }
}

// per-expert keys so satisfied; shape problems go to bad_shape.
std::set<std::string> load_fused_experts(Qwen3Model& model, const TensorSource& set,
                                         std::set<std::string>* used,
                                         std::vector<std::string>* bad_shape,
                                         const std::vector<models::FlatRange>* only) {
  std::set<std::string> done;
  const Qwen3Args& a = model.args();
  const int64_t E = a.num_experts, F = a.moe_hidden_dim, D = a.dim;
  for (int64_t l = 0; l < a.n_layers; ++l) {
    if (!a.moe_layer(l)) continue;
    const std::string pre = "model.layers." + std::to_string(l) + ".mlp.experts.";
    const std::vector<int64_t>* gu = set.shape_of(pre + "gate_up_proj");
    const std::vector<int64_t>* dn = set.shape_of(pre + "down_proj");
    if (!gu || !dn) continue;
    used->insert(pre + "gate_up_proj");
    used->insert(pre + "down_proj");
    const std::vector<int64_t> gu_shape{E, 2 * F, D}, dn_shape{E, D, F};
    if (*gu != gu_shape || *dn != dn_shape) {
      bad_shape->push_back(pre + "gate_up_proj " + shape_str(*gu) + " / down_proj " +
                           shape_str(*dn) + " (expected " + shape_str(gu_shape) + " / " +
                           shape_str(dn_shape) + ")");
      continue;
    }
    const std::string fq = "layers." + std::to_string(l) + ".moe.experts.";
    // gate_up_proj[e] = [gate (w1[e]); up (w3[e])]
    const int64_t w1 = model.param(fq + "w1").offset, w3 = model.param(fq + "w3").offset;
    for (int64_t e = 0; e < E; ++e) {
      read_into(model, set, pre + "gate_up_proj", gu_shape, e * 2 * F * D, F * D, w1 + e * F * D,
                only);
      read_into(model, set, pre + "gate_up_proj", gu_shape, e * 2 * F * D + F * D, F * D,
                w3 + e * F * D, only);
    }
    read_into(model, set, pre + "down_proj", dn_shape, 0, E * D * F, model.param(fq + "w2").offset,
              only);
    for (int64_t e = 0; e < E; ++e)
      for (const char* h : {"gate_proj", "up_proj", "down_proj"})
        done.insert(pre + std::to_string(e) + "." + h + ".weight");
  }
  return done;
}
}  // namespace

void load_hf_weights(Qwen3Model& model, const TensorSource& set, const std::string& where,
                     const std::vector<models::FlatRange>* only) {
  std::vector<std::string> missing, bad_shape, unexpected;
  std::set<std::string> used;
  const std::set<std::string> fused = load_fused_experts(model, set, &used, &bad_shape, only);
  std::map<std::string, HfTensor> wanted;  // HF key -> where it goes
  for (auto& t : hf_tensors(model))
    if (!fused.count(t.key)) wanted[t.key] = t;
  for (const auto& [key, p] : wanted) {
    const std::vector<int64_t>* t = set.shape_of(key);
    if (!t) {
      missing.push_back(key);
      continue;
    }
    if (*t != p.shape) {
      bad_shape.push_back(key + " " + shape_str(*t) + " (expected " + shape_str(p.shape) + ")");
      continue;
    }
  }
  for (const auto& key : set.names()) {
    if (wanted.count(key) || used.count(key)) continue;
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
  for (const auto& [key, p] : wanted) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    read_into(model, set, key, p.shape, 0, n, p.offset, only);
  }
}

}  // namespace titan::qwen3
