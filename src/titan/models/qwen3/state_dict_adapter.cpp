#include "titan/models/qwen3/state_dict_adapter.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "titan/core/error.h"
#include "titan/models/qwen3/hf_config.h"

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
        const int64_t E = p.shape[0], per = p.shape[1] * p.shape[2];
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
// The MoE layers whose experts are fused on disk (save_original_format=False): gate_up_proj
// [E,2F,D] (w1 = rows [0,F) of each expert, w3 = rows [F,2F)) and down_proj [E,D,F] (w2). Their
// keys go to used, their per-expert keys to per_expert (so satisfied); shape problems to
// bad_shape.
std::set<int64_t> fused_expert_layers(const Qwen3Model& model, const TensorSource& set,
                                      std::set<std::string>* used,
                                      std::set<std::string>* per_expert,
                                      std::vector<std::string>* bad_shape) {
  std::set<int64_t> fused;
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
    fused.insert(l);
    for (int64_t e = 0; e < E; ++e)
      for (const char* h : {"gate_proj", "up_proj", "down_proj"})
        per_expert->insert(pre + std::to_string(e) + "." + h + ".weight");
  }
  return fused;
}

// Where a parameter's whole tensor (flattened) lies in an HF state dict, resolved once per
// parameter: one tensor of the same layout (`key`, also w2's fused down_proj [E, D, F]); or, for
// routed experts, `per` elements per expert in the per-expert tensors `keys[e]`, or at offset
// `first` of each expert's 2·per rows of the fused gate_up_proj [E, 2F, D] (w1 then w3).
struct HfSource {
  std::string key;
  std::vector<std::string> keys;
  std::vector<int64_t> shape;
  int64_t per = 0, first = 0;
  bool gate_up = false;

  HfSource(const models::ParamInfo& p, const std::set<int64_t>& fused) : shape(p.shape) {
    const auto [idx, rest] = split_layer(p.fqn, "layers.");
    if (idx.empty() || rest.rfind("moe.experts.", 0) != 0) {
      key = to_hf_key(p.fqn);
      return;
    }
    const std::string which = rest.substr(12), pre = "model.layers." + idx + ".mlp.experts.";
    const int64_t E = p.shape[0];
    per = p.shape[1] * p.shape[2];
    if (fused.count(std::stoll(idx))) {
      if (which == "w2") {
        key = pre + "down_proj";
        per = 0;
        return;
      }
      key = pre + "gate_up_proj";
      shape = {E, 2 * p.shape[1], p.shape[2]};
      first = which == "w3" ? per : 0;
      gate_up = true;
      return;
    }
    const char* h = which == "w1" ? "gate_proj" : which == "w3" ? "up_proj" : "down_proj";
    shape = {p.shape[1], p.shape[2]};
    for (int64_t e = 0; e < E; ++e) keys.push_back(pre + std::to_string(e) + "." + h + ".weight");
  }

  // dst[0, n) ← elements [w, w + n) of the parameter's whole tensor.
  void read(const TensorSource& set, int64_t w, int64_t n, float* dst) const {
    if (per == 0) {
      set.read_f32_range(key, shape, w, w + n, dst);
      return;
    }
    while (n > 0) {  // the experts the range crosses
      const int64_t e = w / per, r = w % per, m = std::min(n, per - r);
      if (gate_up)
        set.read_f32_range(key, shape, e * 2 * per + first + r, e * 2 * per + first + r + m, dst);
      else
        set.read_f32_range(keys[static_cast<size_t>(e)], shape, r, r + m, dst);
      w += m, n -= m, dst += m;
    }
  }
};
}  // namespace

void load_hf_weights(Qwen3Model& model, const TensorSource& set, const std::string& where,
                     const std::vector<models::FlatRange>* only) {
  std::vector<std::string> missing, bad_shape, unexpected;
  std::set<std::string> used, per_expert;
  const std::set<int64_t> fused = fused_expert_layers(model, set, &used, &per_expert, &bad_shape);
  std::map<std::string, std::vector<int64_t>> wanted;  // HF key -> its shape, sorted
  for (const auto& t : hf_tensors(model))
    if (!per_expert.count(t.key)) wanted[t.key] = t.shape;
  for (const auto& [key, want] : wanted) {
    const std::vector<int64_t>* shape = set.shape_of(key);
    if (!shape)
      missing.push_back(key);
    else if (*shape != want)
      bad_shape.push_back(key + " " + shape_str(*shape) + " (expected " + shape_str(want) + ")");
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
    // A key one byte away from a missing one is a damaged header, not another model.
    for (const auto& m : missing)
      for (const auto& u : unexpected)
        if (m.size() == u.size() && std::inner_product(m.begin(), m.end(), u.begin(), 0,
                                                       std::plus<>(), std::not_equal_to<>()) == 1)
          throw Error(where + ": the weights' key '" + u +
                      "' is one byte away from the expected '" + m +
                      "': the safetensors header is likely damaged (a flipped bit); restore the "
                      "file");
    throw Error(msg + " check that config.json and the weights belong together");
  }
  // A tied model whose file still carries an lm_head.weight: harmless when it equals the
  // embedding (some exports write both); otherwise which of the two is the head is ambiguous
  // (titan and Transformers would use the embedding), so it is refused.
  const std::string emb = "model.embed_tokens.weight";
  if (model.args().tie_embeddings && set.shape_of("lm_head.weight") && set.shape_of(emb)) {
    const std::vector<int64_t> shape = *set.shape_of(emb);
    const auto tied_msg = [&](const std::string& how) {
      return where + ": config.json has tie_word_embeddings true, but the weights carry an " +
             "lm_head.weight " + how +
             ": set tie_word_embeddings false in config.json to use that head, or drop it";
    };
    check(*set.shape_of("lm_head.weight") == shape, tied_msg("of another shape"));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    constexpr int64_t kChunk = int64_t{1} << 20;
    std::vector<float> a(static_cast<size_t>(std::min(n, kChunk))), b(a.size());
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t z = std::min(n, at + kChunk);
      set.read_f32_range(emb, shape, at, z, a.data());
      set.read_f32_range("lm_head.weight", shape, at, z, b.data());
      check(std::memcmp(a.data(), b.data(), static_cast<size_t>(z - at) * sizeof(float)) == 0,
            tied_msg("that differs from " + emb));
    }
  }
  // Each parameter's data held here (its tensor/expert-parallel slice, or all of it), within
  // `only` when given.
  float* P = model.store().param_data();
  for (const auto& p : model.params()) {
    if (p.alias) continue;
    const HfSource src(p, fused);
    auto read_held = [&](int64_t a, int64_t z) {
      models::for_each_whole_run(
          p, a, z, [&](int64_t w, int64_t l, int64_t n) { src.read(set, w, n, P + p.offset + l); });
    };
    if (!only) {
      read_held(0, p.numel);
      continue;
    }
    for (const auto& r : *only) {
      const int64_t lo = std::max(r.begin, p.offset),
                    hi = std::min(r.begin + r.len, p.offset + p.numel);
      if (lo < hi) read_held(lo - p.offset, hi - p.offset);
    }
  }
}

std::vector<HfTensor> Qwen3StateDictAdapter::hf_tensors() const {
  check(!m_.tp_slice().active(),
        "the Hugging Face tensors are those of a whole model (gather the slices)");
  return qwen3::hf_tensors(m_);
}

nlohmann::json Qwen3StateDictAdapter::hf_config(const nlohmann::json& base,
                                                const std::string& dtype) const {
  return hf_config_json(m_.args(), base, dtype);
}

}  // namespace titan::qwen3
