#include "titan/models/qwen3/args.h"

#include <algorithm>
#include <map>

#include "titan/core/error.h"

namespace titan::qwen3 {
namespace {
constexpr int64_t kMaxIndex = 2147483647;  // int32 ids, positions and expert indices

Qwen3Args make(int64_t vocab, int64_t dim, int64_t layers, int64_t heads, int64_t kv,
               int64_t hidden, int64_t max_ctx, bool tied) {
  Qwen3Args a;
  a.vocab_size = vocab;
  a.dim = dim;
  a.n_layers = layers;
  a.n_heads = heads;
  a.n_kv_heads = kv;
  a.head_dim = 128;
  a.hidden_dim = hidden;
  a.rope_theta = 1e6;
  a.max_seq_len = max_ctx;
  a.tie_embeddings = tied;
  return a;
}

// torchtitan's MoE flavors: every layer sparse, softmax router with route_norm, untied.
Qwen3Args make_moe(int64_t vocab, int64_t dim, int64_t layers, int64_t heads, int64_t kv,
                   int64_t hidden, int64_t moe_hidden, int64_t experts, int64_t top_k, double theta,
                   int64_t max_ctx) {
  Qwen3Args a = make(vocab, dim, layers, heads, kv, hidden, max_ctx, false);
  a.rope_theta = theta;
  a.num_experts = experts;
  a.top_k = top_k;
  a.moe_hidden_dim = moe_hidden;
  a.norm_topk_prob = true;
  a.load_balance_coeff = 1e-3;
  return a;
}

const std::map<std::string, Qwen3Args>& table() {
  static const std::map<std::string, Qwen3Args> t = {
      {"debugmodel", make(2048, 256, 8, 16, 8, 3072, 4096, true)},
      {"0.6B", make(151936, 1024, 28, 16, 8, 3072, 40960, true)},
      {"1.7B", make(151936, 2048, 28, 16, 8, 6144, 40960, true)},
      {"4B", make(151936, 2560, 36, 32, 8, 9728, 40960, true)},
      {"8B", make(151936, 4096, 36, 32, 8, 12288, 40960, false)},
      {"14B", make(151936, 5120, 40, 40, 8, 17408, 40960, false)},
      {"32B", make(151936, 5120, 64, 64, 8, 25600, 40960, false)},
      // hidden (dense SwiGLU, used only by mlp_only_layers): the HF configs' intermediate_size.
      {"debugmodel_moe", make_moe(2048, 256, 8, 16, 8, 3072, 768, 64, 8, 1e6, 4096)},
      {"30B-A3B", make_moe(151936, 2048, 48, 32, 4, 6144, 768, 128, 8, 1e6, 40960)},
      // torchtitan uses theta 5e6 (the 2507 releases); the published Qwen3-235B-A22B
      // config.json has rope_theta 1e6 and 40960 positions, which is what this flavor uses.
      {"235B-A22B", make_moe(151936, 4096, 94, 64, 4, 12288, 1536, 128, 8, 1e6, 40960)},
  };
  return t;
}
}  // namespace

const std::vector<std::string>& flavor_names() {
  static const std::vector<std::string> n = {"debugmodel", "0.6B",     "1.7B", "4B",
                                             "8B",         "14B",      "32B",  "debugmodel_moe",
                                             "30B-A3B",    "235B-A22B"};
  return n;
}

Qwen3Args flavor(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string names;
    for (const auto& n : flavor_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("model.flavor '" + name + "' is not a Qwen3 flavor; choose one of: " + names);
  }
  return it->second;
}

bool Qwen3Args::param_count(int64_t* out) const {
  bool bad = false;
  auto mul = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    bad |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    bad |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t D = dim, V = vocab_size;
  const int64_t q = mul(n_heads, head_dim), kv = mul(n_kv_heads, head_dim);
  // Norms, attention (wq, wk, wv, q_norm, k_norm, wo).
  const int64_t attn =
      add(add(mul(2, D), mul(2, head_dim)), add(mul(mul(2, q), D), mul(mul(2, kv), D)));
  const int64_t dense = add(attn, mul(mul(3, hidden_dim), D));
  int64_t sparse = 0;
  if (is_moe())
    sparse = add(attn, add(mul(num_experts, D), mul(mul(3, num_experts), mul(moe_hidden_dim, D))));
  // MoE layers: every decoder_sparse_step-th, less the distinct mlp_only_layers among them
  // (counted without a loop over n_layers, which may be absurd here).
  int64_t moe_layers = 0;
  if (is_moe() && decoder_sparse_step > 0 && n_layers > 0) {
    moe_layers = n_layers / decoder_sparse_step;
    std::vector<int64_t> only = mlp_only_layers;
    std::sort(only.begin(), only.end());
    only.erase(std::unique(only.begin(), only.end()), only.end());
    for (int64_t l : only)
      moe_layers -= l >= 0 && l < n_layers && (l + 1) % decoder_sparse_step == 0;
  }
  int64_t n = mul(V, D);  // tok_embeddings
  n = add(n, add(mul(moe_layers, sparse), mul(n_layers - moe_layers, dense)));
  n = add(n, D);                               // final norm
  if (!tie_embeddings) n = add(n, mul(V, D));  // lm_head
  *out = n;
  return !bad;
}

void Qwen3Args::validate() const {
  auto positive = [](int64_t v, const char* field) {
    check(v > 0, std::string("model.") + field + " must be positive, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(dim, "dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(hidden_dim, "hidden_dim");
  positive(max_seq_len, "max_seq_len");
  // Token ids and positions are int32: a vocabulary or context beyond 2^31 cannot be indexed.
  check(vocab_size <= kMaxIndex + 1, "model.vocab_size " + std::to_string(vocab_size) +
                                         " is out of range (token ids are 32-bit, at most " +
                                         std::to_string(kMaxIndex + 1) + " ids)");
  check(max_seq_len <= kMaxIndex + 1, "model.max_seq_len " + std::to_string(max_seq_len) +
                                          " is out of range (positions are 32-bit, at most " +
                                          std::to_string(kMaxIndex + 1) + ")");
  check(n_heads % n_kv_heads == 0, "model.n_heads (" + std::to_string(n_heads) +
                                       ") must be a multiple of model.n_kv_heads (" +
                                       std::to_string(n_kv_heads) + ")");
  check(head_dim % 2 == 0, "model.head_dim must be even for RoPE, got " + std::to_string(head_dim));
  check(rope_theta > 0, "model.rope_theta must be positive");
  check(norm_eps > 0, "model.norm_eps must be positive");
  check(attn_mask_type == "causal" || attn_mask_type == "block_causal",
        "model.attn_mask_type '" + attn_mask_type + "' must be causal or block_causal");
  if (!is_moe()) {
    check_size();
    return;
  }
  positive(top_k, "top_k");
  positive(moe_hidden_dim, "moe_hidden_dim");
  positive(decoder_sparse_step, "decoder_sparse_step");
  check(top_k <= num_experts, "model.top_k (" + std::to_string(top_k) +
                                  ") must not exceed model.num_experts (" +
                                  std::to_string(num_experts) + ")");
  for (int64_t l : mlp_only_layers)
    check(l >= 0 && l < n_layers, "model.mlp_only_layers names layer " + std::to_string(l) +
                                      " of a model with " + std::to_string(n_layers) + " layers");
  check(router_aux_loss_coef >= 0, "model.router_aux_loss_coef must not be negative");
  check(load_balance_coeff >= 0, "model.load_balance_coeff must not be negative");
  check(num_experts <= kMaxIndex, "model.num_experts " + std::to_string(num_experts) +
                                      " is out of range (expert indices are 32-bit, at most " +
                                      std::to_string(kMaxIndex) + ")");
  check_size();
}

void Qwen3Args::check_size() const {
  int64_t n = 0;
  check(param_count(&n), "the model sizes overflow a 64-bit parameter count (vocab_size " +
                             std::to_string(vocab_size) + ", dim " + std::to_string(dim) +
                             ", n_layers " + std::to_string(n_layers) + ", hidden_dim " +
                             std::to_string(hidden_dim) +
                             (is_moe() ? ", num_experts " + std::to_string(num_experts) +
                                             ", moe_hidden_dim " + std::to_string(moe_hidden_dim)
                                       : std::string()) +
                             "); reduce them");
}

bool Qwen3Args::moe_layer(int64_t i) const {
  if (!is_moe() || (i + 1) % decoder_sparse_step != 0) return false;
  for (int64_t l : mlp_only_layers)
    if (l == i) return false;
  return true;
}

int64_t Qwen3Args::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < n_layers; ++i) n += moe_layer(i);
  return n;
}

}  // namespace titan::qwen3
