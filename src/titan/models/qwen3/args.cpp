#include "titan/models/qwen3/args.h"

#include <map>

#include "titan/core/error.h"

namespace titan::qwen3 {
namespace {
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

const std::map<std::string, Qwen3Args>& table() {
  static const std::map<std::string, Qwen3Args> t = {
      {"debugmodel", make(2048, 256, 8, 16, 8, 3072, 4096, true)},
      {"0.6B", make(151936, 1024, 28, 16, 8, 3072, 40960, true)},
      {"1.7B", make(151936, 2048, 28, 16, 8, 6144, 40960, true)},
      {"4B", make(151936, 2560, 36, 32, 8, 9728, 40960, true)},
      {"8B", make(151936, 4096, 36, 32, 8, 12288, 40960, false)},
      {"14B", make(151936, 5120, 40, 40, 8, 17408, 40960, false)},
      {"32B", make(151936, 5120, 64, 64, 8, 25600, 40960, false)},
  };
  return t;
}
}  // namespace

const std::vector<std::string>& flavor_names() {
  static const std::vector<std::string> n = {"debugmodel", "0.6B", "1.7B", "4B",
                                             "8B",         "14B",  "32B"};
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
  check(n_heads % n_kv_heads == 0, "model.n_heads (" + std::to_string(n_heads) +
                                       ") must be a multiple of model.n_kv_heads (" +
                                       std::to_string(n_kv_heads) + ")");
  check(head_dim % 2 == 0, "model.head_dim must be even for RoPE, got " + std::to_string(head_dim));
  check(rope_theta > 0, "model.rope_theta must be positive");
  check(norm_eps > 0, "model.norm_eps must be positive");
  check(attn_mask_type == "causal" || attn_mask_type == "block_causal",
        "model.attn_mask_type '" + attn_mask_type + "' must be causal or block_causal");
}

}  // namespace titan::qwen3
