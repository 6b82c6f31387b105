#include "titan/models/lora.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::models {

namespace {
// "layers.3.attention.wq.weight" -> "wq"; "" for anything that is not a layer's 2-D weight.
std::string leaf_of(const ParamInfo& p) {
  const std::string suffix = ".weight";
  if (p.shape.size() != 2 || p.fqn.rfind("layers.", 0) != 0 || p.fqn.size() <= suffix.size() ||
      p.fqn.compare(p.fqn.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  const std::string mod = p.fqn.substr(0, p.fqn.size() - suffix.size());
  return mod.substr(mod.rfind('.') + 1);
}
std::string strip_weight(const std::string& key) {
  const std::string suffix = ".weight";
  return key.size() > suffix.size() &&
                 key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0
             ? key.substr(0, key.size() - suffix.size())
             : key;
}
}  // namespace

LoraModel::LoraModel(std::unique_ptr<Model> base, const LoraOptions& o, bool allocate)
    : base_(std::move(base)), o_(o), be_(ops::backend(base_->device(), "float32")) {
  check(o.rank > 0, "lora.rank must be positive");
  scale_ = static_cast<float>(o.use_rslora ? o.alpha / std::sqrt(static_cast<double>(o.rank))
                                           : o.alpha / static_cast<double>(o.rank));
  leaves_ = lora_target_leaves(o.target_modules);
  std::map<std::string, std::string> hf_module;  // base FQN -> HF module name
  for (const auto& t : base_->hf().hf_tensors()) hf_module[t.fqn] = strip_weight(t.key);
  // MoE: the feed-forward projections are not adapted (neither the experts nor the dense layers:
  // PEFT reads gate_proj/up_proj/down_proj of a Qwen3-MoE model as its fused experts).
  bool moe = false;
  for (const auto& p : base_->params())
    moe = moe || p.fqn.find(".moe.experts.") != std::string::npos;
  if (moe) {
    const auto n = leaves_.size();
    std::erase_if(leaves_,
                  [](const std::string& l) { return l == "w1" || l == "w2" || l == "w3"; });
    if (leaves_.size() != n && allocate)
      log::info(
          "LoRA on an MoE model: the attention projections only (feed-forward targets "
          "w1, w2, w3 are not adapted in MoE models)");
    check(!leaves_.empty(), "lora.target_modules '" + o.target_modules +
                                "' names only feed-forward projections, which are not adapted "
                                "in an MoE model; add wq,wk,wv,wo");
  }
  const int64_t r = o.rank;
  int64_t off = 0;
  for (const auto& p : base_->params()) {
    if (p.alias) continue;
    const std::string leaf = leaf_of(p);
    if (leaf.empty() || std::find(leaves_.begin(), leaves_.end(), leaf) == leaves_.end()) continue;
    Adapter a;
    a.base_offset = p.offset;
    a.rows = p.shape[0];
    a.in = p.shape[1];
    auto it = hf_module.find(p.fqn);
    check(it != hf_module.end(), "LoRA: the base has no Hugging Face name for '" + p.fqn + "'");
    a.hf_module = it->second;
    const std::string prefix = p.fqn.substr(0, p.fqn.size() - 7);  // without ".weight"
    a.a = off;
    auto whole = [&](std::string fqn, std::vector<int64_t> shape) {  // held whole, no slice
      ParamInfo q;
      q.fqn = std::move(fqn);
      q.numel = shape[0] * shape[1];
      q.shape = std::move(shape);
      q.offset = off;
      q.group = p.group;
      params_.push_back(std::move(q));
    };
    whole(prefix + ".lora_A.weight", {r, a.in});
    off += r * a.in;
    a.b = off;
    whole(prefix + ".lora_B.weight", {a.rows, r});
    off += a.rows * r;
    ad_.push_back(std::move(a));
  }
  check(!ad_.empty(), "lora.target_modules '" + o.target_modules +
                          "' matches no projection of the model; use wq,wk,wv,wo,w1,w2,w3");
  // PEFT accepts any rank, but one at or above a projection's smaller side is no longer low
  // rank: those adapters hold more than the weight they adapt. Said once.
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const Adapter& a : ad_) smallest = std::min({smallest, a.rows, a.in});
  if (allocate && r >= smallest)
    log::warn("lora.rank " + std::to_string(r) + " is not below the smallest adapted " +
              "projection's dimension (" + std::to_string(smallest) +
              "): those adapters are not low-rank and cost more than training the weight itself "
              "(lora.rank 0)");
  store_.emplace(ParamStore::Layout{off, param_units(params_), 0, {}}, ParamStore::Options{}, be_);
  if (!allocate) return;
  store_->allocate();
  init_weights(o.seed);
  base_->set_linear_hooks(this);
}

LoraModel::~LoraModel() {
  if (base_) base_->set_linear_hooks(nullptr);
}

void LoraModel::init_weights(uint64_t seed, float /*std*/, int64_t /*unit*/) {
  float* P = store_->param_data();
  for (size_t i = 0; i < ad_.size(); ++i) {
    const Adapter& a = ad_[i];
    float* A = P + a.a;
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.in));
    for (int64_t k = 0; k < o_.rank * a.in; ++k)
      A[k] = static_cast<float>(
          bound *
          (2.0 * uniform_open(random_u64(seed, 0x10A0000 + i, static_cast<uint64_t>(k))) - 1.0));
    std::fill_n(P + a.b, a.rows * o_.rank, 0.0f);
  }
}

ops::LossSum LoraModel::forward_backward(const Batch& b, float grad_scale, float aux_weight) {
  store_->sync_device();
  training_ = true;
  ++pass_;
  try {
    const ops::LossSum r = base_->forward_backward(b, grad_scale, aux_weight);
    training_ = false;
    return r;
  } catch (...) {
    training_ = false;
    throw;
  }
}

const std::vector<std::pair<size_t, int64_t>>& LoraModel::block(int64_t w, int64_t in,
                                                                int64_t out) {
  auto it = blocks_.find(w);
  if (it != blocks_.end()) return it->second;
  std::vector<std::pair<size_t, int64_t>> v;
  for (size_t i = 0; i < ad_.size(); ++i) {
    const Adapter& a = ad_[i];
    if (a.base_offset >= w && a.base_offset + a.rows * a.in <= w + out * in && a.in == in)
      v.emplace_back(i, (a.base_offset - w) / in);
  }
  return blocks_.emplace(w, std::move(v)).first->second;
}

const float* LoraModel::dropped(size_t i, const float* x, int64_t M, int64_t in) {
  if (!training_ || o_.dropout <= 0) return x;
  grow(&xd_, M * in);
  be_.dropout(x, xd_.data(), M * in, o_.seed, mask_stream(i), o_.dropout);
  return xd_.data();
}

void LoraModel::forward(int64_t w, const float* x, float* y, int64_t M, int64_t in, int64_t out) {
  const int64_t r = o_.rank;
  const float* P = store_->weights();
  for (const auto& [i, col] : block(w, in, out)) {
    const Adapter& a = ad_[i];
    grow(&u_, M * r);
    const float* xi = dropped(i, x, M, in);
    be_.gemm(false, true, M, r, in, xi, in, P + a.a, in, u_.data(), r, false);  // x·Aᵀ
    be_.scale_inplace(u_.data(), M * r, scale_);
    be_.gemm(false, true, M, a.rows, r, u_.data(), r, P + a.b, r, y + col, out, true);  // += u·Bᵀ
  }
}

void LoraModel::backward(int64_t w, const float* dy, const float* x, float* dx, int64_t M,
                         int64_t in, int64_t out) {
  if (!training_) return;
  const int64_t r = o_.rank;
  const float* P = store_->weights();
  float* G = store_->grads();
  for (const auto& [i, col] : block(w, in, out)) {
    const Adapter& a = ad_[i];
    grow(&u_, M * r);
    grow(&du_, M * r);
    const float* xi = dropped(i, x, M, in);
    be_.gemm(false, true, M, r, in, xi, in, P + a.a, in, u_.data(), r, false);
    be_.scale_inplace(u_.data(), M * r, scale_);
    be_.gemm(true, false, a.rows, r, M, dy + col, out, u_.data(), r, G + a.b, r, true);  // dB
    be_.gemm(false, false, M, r, a.rows, dy + col, out, P + a.b, r, du_.data(), r, false);
    be_.scale_inplace(du_.data(), M * r, scale_);
    be_.gemm(true, false, r, in, M, du_.data(), r, xi, in, G + a.a, in, true);  // dA
    if (xi == x) {
      be_.gemm(false, false, M, in, r, du_.data(), r, P + a.a, in, dx, in, true);  // dx += du·A
    } else {  // through the dropout: the same mask, recomputed
      be_.gemm(false, false, M, in, r, du_.data(), r, P + a.a, in, xd_.data(), in, false);
      be_.dropout_add(xd_.data(), dx, M * in, o_.seed, mask_stream(i), o_.dropout);
    }
  }
}

void LoraModel::merge_adapters(bool merge) {
  float* W = base_->store().param_data();  // the host's (marks the base's compute copy stale)
  const float* P = std::as_const(*store_).param_data();
  const int64_t r = o_.rank;
  if (!merge) {
    for (size_t i = 0; i < unmerged_.size(); ++i)
      std::copy(unmerged_[i].begin(), unmerged_[i].end(), W + ad_[i].base_offset);
    unmerged_.clear();
    base_->store().release_masters();  // under bf16: the projections as their copy again
    return;
  }
  check(unmerged_.empty(), "LoRA adapters are merged already");
  std::vector<float> delta;
  for (const Adapter& a : ad_) {
    float* w = W + a.base_offset;
    unmerged_.emplace_back(w, w + a.rows * a.in);
    delta.assign(static_cast<size_t>(a.rows * a.in), 0.0f);
    ops::gemm(false, false, a.rows, a.in, r, P + a.b, r, P + a.a, a.in, delta.data(), a.in,
              false);  // host arrays: the CPU's GEMM
    for (int64_t k = 0; k < a.rows * a.in; ++k) w[k] += scale_ * delta[static_cast<size_t>(k)];
  }
}

double LoraModel::flops_per_token(int64_t seq_len) const {
  return base_->flops_per_token(seq_len) - 2.0 * static_cast<double>(base_->num_flop_params()) +
         6.0 * static_cast<double>(num_params());
}

std::vector<HfTensor> LoraModel::hf_tensors() const {
  std::vector<HfTensor> out;
  for (size_t i = 0; i < ad_.size(); ++i) {
    const Adapter& a = ad_[i];
    const std::string key = "base_model.model." + a.hf_module;
    out.push_back({key + ".lora_A.weight", {o_.rank, a.in}, a.a, params_[2 * i].fqn});
    out.push_back({key + ".lora_B.weight", {a.rows, o_.rank}, a.b, params_[2 * i + 1].fqn});
  }
  return out;
}

void LoraModel::load_hf(const TensorSource& src, const std::string& where,
                        const std::vector<FlatRange>* /*only*/) {
  std::vector<std::string> missing, bad_shape, unexpected;
  std::set<std::string> expected;
  const auto tensors = hf_tensors();
  for (const auto& t : tensors) {
    expected.insert(t.key);
    const auto* shape = src.shape_of(t.key);
    if (!shape)
      missing.push_back(t.key);
    else if (*shape != t.shape)
      bad_shape.push_back(t.key);
  }
  for (const auto& n : src.names())
    if (!expected.count(n)) unexpected.push_back(n);
  if (!missing.empty() || !bad_shape.empty() || !unexpected.empty()) {
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 4; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > 4) s += ", ... (" + std::to_string(v.size()) + " in all)";
      return s;
    };
    std::string msg = where + ": not an adapter for this model with lora.rank " +
                      std::to_string(o_.rank) + " and lora.target_modules '" + o_.target_modules +
                      "':";
    if (!missing.empty()) msg += " missing keys: " + join(missing) + ";";
    if (!bad_shape.empty()) msg += " keys of another shape: " + join(bad_shape) + ";";
    if (!unexpected.empty()) msg += " unexpected keys: " + join(unexpected) + ";";
    throw Error(msg);
  }
  float* P = store_->param_data();
  for (const auto& t : tensors) src.read_f32(t.key, t.shape, P + t.offset);
}

nlohmann::json LoraModel::hf_config(const nlohmann::json& /*base*/,
                                    const std::string& /*dtype*/) const {
  std::set<std::string> modules;
  for (const Adapter& a : ad_) modules.insert(a.hf_module.substr(a.hf_module.rfind('.') + 1));
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path",
           o_.base_name_or_path.empty() ? nlohmann::json() : nlohmann::json(o_.base_name_or_path)},
          {"r", o_.rank},
          {"lora_alpha", o_.alpha},
          {"lora_dropout", o_.dropout},
          {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
          {"use_rslora", o_.use_rslora},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"use_dora", false}};
}

}  // namespace titan::models
