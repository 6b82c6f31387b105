// Qwen3 dense architecture hyper-parameters and torchtitan's flavors (torchtitan qwen3_configs).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace titan::qwen3 {

struct Qwen3Args {
  int64_t vocab_size = 2048;
  int64_t dim = 256;
  int64_t n_layers = 8;
  int64_t n_heads = 16;
  int64_t n_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t hidden_dim = 3072;  // SwiGLU inner size (given explicitly, no 2/3 rule)
  double rope_theta = 1e6;
  float norm_eps = 1e-6f;
  int64_t max_seq_len = 4096;  // the flavor's maximum context (RoPE table limit)
  bool tie_embeddings = true;
  std::string attn_mask_type = "block_causal";  // block_causal | causal

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Throws titan::Error naming the first inconsistent field.
  void validate() const;
};

// Names of the dense flavors, in size order.
const std::vector<std::string>& flavor_names();
// The flavor's arguments; throws titan::Error listing the valid names for an unknown one.
Qwen3Args flavor(const std::string& name);

}  // namespace titan::qwen3
