// The Qwen3 dense model (HF Qwen3ForCausalLM math, torchtitan FQNs) on the CPU in fp32.
//
// Parameters and gradients live in one flat buffer each, laid out block by block: group 0 is
// tok_embeddings, groups 1..L the decoder layers, group L+1 the final norm and an untied lm_head.
// Inside a layer, wq|wk|wv and w1|w3 are adjacent so each pair runs as one GEMM. Sharding a block
// or keeping a bf16 copy is a matter of the offsets in params().
//
// Activations for one microbatch of up to max_batch × max_seq tokens are allocated at
// construction; forward_backward() allocates nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/models/qwen3/args.h"
#include "titan/ops/loss.h"
#include "titan/ops/rope_op.h"

namespace titan::qwen3 {

struct ParamInfo {
  std::string fqn;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // into the flat parameter buffer
  int64_t numel = 0;
  int64_t group = 0;   // 0 embeddings, 1..L layers, L+1 head
  bool alias = false;  // lm_head.weight when tied: same storage as tok_embeddings.weight
};

// One microbatch: B rows of S tokens. positions restart at 0 at each document.
struct Batch {
  int64_t B = 0, S = 0;
  const int32_t* input = nullptr;
  const int32_t* labels = nullptr;  // -100 = ignore
  const int32_t* positions = nullptr;
};

class Qwen3Model {
 public:
  // rope_ops: the RoPE kernel pair of each layer (from the module tree and its overrides);
  // empty means the built-in cos/sin RoPE everywhere.
  Qwen3Model(const Qwen3Args& args, int64_t max_batch, int64_t max_seq, int64_t loss_chunks = 8,
             std::vector<ops::RopeOp> rope_ops = {});

  const Qwen3Args& args() const { return a_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& param(const std::string& fqn) const;
  int64_t num_params() const { return params_buf_.size(); }  // unique parameters
  float* param_data() { return params_buf_.data(); }
  const float* param_data() const { return params_buf_.data(); }
  float* grad_data() { return grads_buf_.data(); }
  float* param_ptr(const std::string& fqn) { return params_buf_.data() + param(fqn).offset; }
  float* grad_ptr(const std::string& fqn) { return grads_buf_.data() + param(fqn).offset; }

  // torchtitan/HF init: Linear and untied embedding weights ~ N(0, 0.02), norms 1. Each tensor
  // draws from its own counter-based stream, so the result is independent of threads.
  void init_weights(uint64_t seed, float std = 0.02f);
  void zero_grad() { grads_buf_.zero(); }

  // Forward and backward of one microbatch; gradients accumulate (+=) scaled by grad_scale
  // (1 / valid tokens of the whole step). Returns Σ CE over valid labels and their count.
  ops::LossSum forward_backward(const Batch& b, float grad_scale);
  // Forward only (evaluation): Σ CE and the count.
  ops::LossSum forward_loss(const Batch& b);
  // Forward only: all logits, out[B·S, V] (labels may be null). For evaluation and parity checks;
  // training never forms all logits.
  void forward_logits(const Batch& b, float* out);

  // torchtitan: 6·N (embedding excluded unless tied) + 6·L·H·2·head_dim·seq_len.
  double flops_per_token(int64_t seq_len) const;
  // Parameters counted in the FLOPs formula (N above).
  int64_t num_flop_params() const;

 private:
  struct Layer {
    int64_t attention_norm, wqkv, q_norm, k_norm, wo, ffn_norm, w13, w2;  // parameter offsets
  };
  struct Saved {  // activations of one layer kept for the backward
    float *x, *xn1, *rstd1, *qkv, *qr, *kr, *rstd_q, *rstd_k, *o, *lse, *hmid, *xn2, *rstd2, *ab,
        *g;
  };
  ops::LossSum run(const Batch& b, float grad_scale, bool backward, float* logits_out = nullptr);
  void call_rope(int64_t layer, bool forward, float* x, const Batch& b, int64_t heads, int64_t ld);
  void add_param(const std::string& fqn, std::vector<int64_t> shape, int64_t group, int64_t* off);

  Qwen3Args a_;
  int64_t max_tokens_, max_batch_, max_seq_, loss_chunk_rows_;
  std::vector<ParamInfo> params_;
  Buffer<float> params_buf_, grads_buf_;
  std::vector<Layer> layers_;
  int64_t tok_emb_ = 0, norm_ = 0, lm_head_ = 0;

  Buffer<float> rope_;                 // [max_seq, head_dim] cos|sin
  std::vector<ops::RopeOp> rope_ops_;  // per layer
  Arena acts_;                         // saved activations, all layers
  std::vector<Saved> saved_;           // per layer views into acts_
  float *h_final_, *xf_, *rstd_f_;
  Arena work_;  // temporaries reused by every layer
  float *tmp_, *dx_, *dxn_, *dqkv_, *dq_, *dkr_, *do_, *dab_, *dg_, *attn_scratch_, *norm_scratch_,
      *delta_, *loss_scratch_;
  Buffer<int32_t> seg_;  // attention segment starts for the current microbatch
};

}  // namespace titan::qwen3
