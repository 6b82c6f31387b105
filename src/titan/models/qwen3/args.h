// Qwen3 / Qwen3-MoE architecture hyper-parameters and torchtitan's flavors (torchtitan
// qwen3_configs). A model with num_experts > 0 is Qwen3-MoE: layer i has a sparse MoE block in
// place of the feed-forward unless i is in mlp_only_layers or (i+1) % decoder_sparse_step != 0
// (HF Qwen3MoeDecoderLayer); the other layers keep the dense SwiGLU of hidden_dim.
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

  // ---- MoE (num_experts == 0: dense)
  int64_t num_experts = 0;
  int64_t top_k = 0;           // experts per token (num_experts_per_tok)
  int64_t moe_hidden_dim = 0;  // expert SwiGLU inner size (moe_intermediate_size)
  bool norm_topk_prob = true;  // renormalize the top-k weights (torchtitan route_norm)
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Transformers' auxiliary load-balancing loss (output_router_logits): loss += coef · aux.
  bool router_aux_loss = false;
  double router_aux_loss_coef = 0.001;
  // torchtitan's auxiliary-loss-free balancing: per-layer expert bias updated before each
  // optimizer step by coeff · sign(mean load − load); 0 disables it.
  double load_balance_coeff = 0.0;

  bool is_moe() const { return num_experts > 0; }
  bool moe_layer(int64_t i) const;
  int64_t n_moe_layers() const;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Parameters the model holds (a tied lm_head counted once), as Qwen3Model lays them out;
  // false when the count overflows int64 (absurd sizes).
  bool param_count(int64_t* out) const;
  // Throws titan::Error naming the first inconsistent or out-of-range field, or the sizes whose
  // parameter count overflows.
  void validate() const;

 private:
  void check_size() const;
};

// Names of the dense flavors, in size order.
const std::vector<std::string>& flavor_names();
// The flavor's arguments; throws titan::Error listing the valid names for an unknown one.
Qwen3Args flavor(const std::string& name);

}  // namespace titan::qwen3
