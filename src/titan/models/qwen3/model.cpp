#include "titan/models/qwen3/model.h"

#include <algorithm>
#include <cmath>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/ops/attention.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"

namespace titan::qwen3 {

void Qwen3Model::add_param(const std::string& fqn, std::vector<int64_t> shape, int64_t group,
                           int64_t* off) {
  ParamInfo p;
  p.fqn = fqn;
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t s : p.shape) p.numel *= s;
  p.offset = *off;
  p.group = group;
  *off += p.numel;
  params_.push_back(std::move(p));
}

Qwen3Model::Qwen3Model(const Qwen3Args& args, int64_t max_batch, int64_t max_seq,
                       int64_t loss_chunks, std::vector<ops::RopeOp> rope_ops)
    : a_(args),
      max_tokens_(max_batch * max_seq),
      max_batch_(max_batch),
      max_seq_(max_seq),
      rope_ops_(std::move(rope_ops)) {
  a_.validate();
  check(max_seq <= a_.max_seq_len, "training.seq_len " + std::to_string(max_seq) +
                                       " exceeds the model's maximum context length " +
                                       std::to_string(a_.max_seq_len) +
                                       " (model.max_seq_len); lower training.seq_len");
  check(loss_chunks > 0, "loss chunks must be positive");
  loss_chunk_rows_ = std::max<int64_t>(1, (max_tokens_ + loss_chunks - 1) / loss_chunks);
  const int64_t D = a_.dim, V = a_.vocab_size, d = a_.head_dim, F = a_.hidden_dim;
  const int64_t L = a_.n_layers, T = max_tokens_;

  // ---- parameter layout
  int64_t off = 0;
  add_param("tok_embeddings.weight", {V, D}, 0, &off);
  tok_emb_ = 0;
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer ly;
    ly.attention_norm = off;
    add_param(p + "attention_norm.weight", {D}, l + 1, &off);
    ly.wqkv = off;
    add_param(p + "attention.wq.weight", {a_.q_dim(), D}, l + 1, &off);
    add_param(p + "attention.wk.weight", {a_.kv_dim(), D}, l + 1, &off);
    add_param(p + "attention.wv.weight", {a_.kv_dim(), D}, l + 1, &off);
    ly.q_norm = off;
    add_param(p + "attention.q_norm.weight", {d}, l + 1, &off);
    ly.k_norm = off;
    add_param(p + "attention.k_norm.weight", {d}, l + 1, &off);
    ly.wo = off;
    add_param(p + "attention.wo.weight", {D, a_.q_dim()}, l + 1, &off);
    ly.ffn_norm = off;
    add_param(p + "ffn_norm.weight", {D}, l + 1, &off);
    ly.w13 = off;
    add_param(p + "feed_forward.w1.weight", {F, D}, l + 1, &off);
    add_param(p + "feed_forward.w3.weight", {F, D}, l + 1, &off);
    ly.w2 = off;
    add_param(p + "feed_forward.w2.weight", {D, F}, l + 1, &off);
    layers_.push_back(ly);
  }
  norm_ = off;
  add_param("norm.weight", {D}, L + 1, &off);
  if (a_.tie_embeddings) {
    ParamInfo p{"lm_head.weight", {V, D}, tok_emb_, V * D, 0, true};
    params_.push_back(p);
    lm_head_ = tok_emb_;
  } else {
    lm_head_ = off;
    add_param("lm_head.weight", {V, D}, L + 1, &off);
  }
  params_buf_.resize(off);
  grads_buf_.resize(off);

  if (rope_ops_.empty()) rope_ops_.assign(static_cast<size_t>(L), ops::cos_sin_rope_op());
  check(static_cast<int64_t>(rope_ops_.size()) == L, "one RoPE op per layer is required");
  rope_.resize(max_seq * d);
  ops::rope_table(max_seq, d, a_.rope_theta, rope_.data());

  // ---- activations saved for the backward
  const int64_t Hq = a_.n_heads, Hkv = a_.n_kv_heads, QKV = a_.qkv_dim(), Q = a_.q_dim(),
                KV = a_.kv_dim();
  const int64_t per_layer = 4 * T * D + 3 * T + T * QKV + T * Q + T * KV + T * Hq + T * Hkv +
                            T * Q + T * Hq + 2 * T * F + T * F + 16 * 16;
  acts_.reserve(L * per_layer + 2 * T * D + T + 64);
  for (int64_t l = 0; l < L; ++l) {
    Saved s;
    s.x = acts_.take(T * D);
    s.xn1 = acts_.take(T * D);
    s.rstd1 = acts_.take(T);
    s.qkv = acts_.take(T * QKV);
    s.qr = acts_.take(T * Q);
    s.kr = acts_.take(T * KV);
    s.rstd_q = acts_.take(T * Hq);
    s.rstd_k = acts_.take(T * Hkv);
    s.o = acts_.take(T * Q);
    s.lse = acts_.take(T * Hq);
    s.hmid = acts_.take(T * D);
    s.xn2 = acts_.take(T * D);
    s.rstd2 = acts_.take(T);
    s.ab = acts_.take(2 * T * F);
    s.g = acts_.take(T * F);
    saved_.push_back(s);
  }
  h_final_ = acts_.take(T * D);
  xf_ = acts_.take(T * D);
  rstd_f_ = acts_.take(T);

  // ---- work buffers shared by all layers
  ops::AttnShape as{max_batch, max_seq, Hq, Hkv, d, 1.f, Q, KV, QKV};
  const int64_t attn_scratch = ops::attention_workspace(as);
  const int64_t norm_scratch = std::max(ops::rmsnorm_bwd_scratch({T, 1, D, D, D}),
                                        ops::rmsnorm_bwd_scratch({T, Hq, d, QKV, Q}));
  const int64_t loss_scratch = ops::lm_head_ce_scratch(T, V, loss_chunk_rows_);
  work_.reserve(3 * T * D + T * QKV + T * Q + T * KV + T * Q + 2 * T * F + T * F + attn_scratch +
                norm_scratch + T * Hq + loss_scratch + 16 * 16);
  tmp_ = work_.take(T * D);
  dx_ = work_.take(T * D);
  dxn_ = work_.take(T * D);
  dqkv_ = work_.take(T * QKV);
  dq_ = work_.take(T * Q);
  dkr_ = work_.take(T * KV);
  do_ = work_.take(T * Q);
  dab_ = work_.take(2 * T * F);
  dg_ = work_.take(T * F);
  attn_scratch_ = work_.take(attn_scratch);
  norm_scratch_ = work_.take(norm_scratch);
  delta_ = work_.take(T * Hq);
  loss_scratch_ = work_.take(loss_scratch);
  seg_.resize(T);
}

const ParamInfo& Qwen3Model::param(const std::string& fqn) const {
  for (const auto& p : params_)
    if (p.fqn == fqn) return p;
  throw Error("no parameter named '" + fqn + "' in the Qwen3 model");
}

void Qwen3Model::init_weights(uint64_t seed, float std) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (p.alias) continue;
    float* w = params_buf_.data() + p.offset;
    if (p.shape.size() == 1) {
      std::fill_n(w, p.numel, 1.0f);  // RMSNorm weights
    } else {
      // The tied embedding is the lm_head weight: it gets the Linear init (same N(0, std)).
      fill_normal(w, p.numel, 0.0f, std, seed, i);
    }
  }
}

ops::LossSum Qwen3Model::forward_backward(const Batch& b, float grad_scale) {
  return run(b, grad_scale, true);
}

ops::LossSum Qwen3Model::forward_loss(const Batch& b) { return run(b, 0.0f, false); }

void Qwen3Model::forward_logits(const Batch& b, float* out) { run(b, 0.0f, false, out); }

ops::LossSum Qwen3Model::run(const Batch& b, float grad_scale, bool backward, float* logits_out) {
  check(b.B <= max_batch_ && b.S <= max_seq_ && b.B * b.S <= max_tokens_,
        "microbatch of " + std::to_string(b.B) + "x" + std::to_string(b.S) +
            " exceeds the model's allocated " + std::to_string(max_batch_) + "x" +
            std::to_string(max_seq_));
  for (int64_t t = 0; t < b.B * b.S; ++t)
    check(b.positions[t] >= 0 && b.positions[t] < max_seq_,
          "position " + std::to_string(b.positions[t]) + " is outside the RoPE table of " +
              std::to_string(max_seq_));
  const int64_t T = b.B * b.S, D = a_.dim, F = a_.hidden_dim, d = a_.head_dim, V = a_.vocab_size;
  const int64_t Hq = a_.n_heads, Hkv = a_.n_kv_heads, Q = a_.q_dim(), KV = a_.kv_dim(),
                QKV = a_.qkv_dim();
  const float eps = a_.norm_eps;
  float* P = params_buf_.data();
  float* G = grads_buf_.data();
  const ops::AttnShape as{b.B, b.S, Hq, Hkv, d, 1.0f / std::sqrt(static_cast<float>(d)),
                          Q,   KV,  QKV};
  const ops::NormRows rows{T, 1, D, D, D};
  const ops::NormRows qrows{T, Hq, d, QKV, Q};
  const ops::NormRows krows{T, Hkv, d, QKV, KV};
  ops::attention_segments(b.positions, b.B, b.S, a_.attn_mask_type == "block_causal", seg_.data());

  // ---------------- forward
  ops::embedding_fwd(b.input, T, P + tok_emb_, V, D, saved_[0].x);
  for (int64_t l = 0; l < a_.n_layers; ++l) {
    const Layer& w = layers_[l];
    Saved& s = saved_[l];
    float* out = l + 1 < a_.n_layers ? saved_[l + 1].x : h_final_;
    ops::rmsnorm_fwd(rows, s.x, P + w.attention_norm, eps, s.xn1, s.rstd1);
    ops::linear_fwd(s.xn1, P + w.wqkv, s.qkv, T, D, QKV);
    ops::rmsnorm_fwd(qrows, s.qkv, P + w.q_norm, eps, s.qr, s.rstd_q);
    ops::rmsnorm_fwd(krows, s.qkv + Q, P + w.k_norm, eps, s.kr, s.rstd_k);
    call_rope(l, true, s.qr, b, Hq, Q);
    call_rope(l, true, s.kr, b, Hkv, KV);
    ops::attention_fwd(as, s.qr, s.kr, s.qkv + Q + KV, seg_.data(), s.o, s.lse, attn_scratch_);
    ops::linear_fwd(s.o, P + w.wo, tmp_, T, Q, D);
    ops::add(s.x, tmp_, s.hmid, T * D);
    ops::rmsnorm_fwd(rows, s.hmid, P + w.ffn_norm, eps, s.xn2, s.rstd2);
    ops::linear_fwd(s.xn2, P + w.w13, s.ab, T, D, 2 * F);
    ops::swiglu_fwd(s.ab, s.g, T, F);
    ops::linear_fwd(s.g, P + w.w2, tmp_, T, F, D);
    ops::add(s.hmid, tmp_, out, T * D);
  }
  ops::rmsnorm_fwd(rows, h_final_, P + norm_, eps, xf_, rstd_f_);
  if (logits_out) {
    ops::linear_fwd(xf_, P + lm_head_, logits_out, T, D, V);
    return {};
  }
  ops::LossSum loss = ops::lm_head_ce(xf_, P + lm_head_, b.labels, T, D, V, loss_chunk_rows_,
                                      backward ? grad_scale : 0.0f, backward ? dxn_ : nullptr,
                                      backward ? G + lm_head_ : nullptr, loss_scratch_);
  if (!backward) return loss;

  // ---------------- backward (dx_ = dL/d(residual stream) flowing down)
  ops::rmsnorm_bwd(rows, dxn_, h_final_, P + norm_, rstd_f_, dx_, G + norm_, norm_scratch_);
  for (int64_t l = a_.n_layers - 1; l >= 0; --l) {
    const Layer& w = layers_[l];
    Saved& s = saved_[l];
    // out = hmid + w2·swiglu(w13·norm(hmid))
    ops::linear_bwd(dx_, s.g, P + w.w2, dg_, G + w.w2, T, F, D);
    ops::swiglu_bwd(dg_, s.ab, dab_, T, F);
    ops::linear_bwd(dab_, s.xn2, P + w.w13, dxn_, G + w.w13, T, D, 2 * F);
    ops::rmsnorm_bwd(rows, dxn_, s.hmid, P + w.ffn_norm, s.rstd2, tmp_, G + w.ffn_norm,
                     norm_scratch_);
    ops::add_inplace(dx_, tmp_, T * D);
    // hmid = x + wo·attention(rope(q_norm(q)), rope(k_norm(k)), v)
    ops::linear_bwd(dx_, s.o, P + w.wo, do_, G + w.wo, T, Q, D);
    ops::attention_bwd(as, s.qr, s.kr, s.qkv + Q + KV, s.o, s.lse, do_, seg_.data(), dq_, dkr_,
                       dqkv_ + Q + KV, delta_, attn_scratch_);
    call_rope(l, false, dq_, b, Hq, Q);
    call_rope(l, false, dkr_, b, Hkv, KV);
    ops::rmsnorm_bwd(qrows, dq_, s.qkv, P + w.q_norm, s.rstd_q, dqkv_, G + w.q_norm, norm_scratch_);
    ops::rmsnorm_bwd(krows, dkr_, s.qkv + Q, P + w.k_norm, s.rstd_k, dqkv_ + Q, G + w.k_norm,
                     norm_scratch_);
    ops::linear_bwd(dqkv_, s.xn1, P + w.wqkv, dxn_, G + w.wqkv, T, D, QKV);
    ops::rmsnorm_bwd(rows, dxn_, s.x, P + w.attention_norm, s.rstd1, tmp_, G + w.attention_norm,
                     norm_scratch_);
    ops::add_inplace(dx_, tmp_, T * D);
  }
  ops::embedding_bwd(b.input, T, dx_, D, G + tok_emb_);
  return loss;
}

void Qwen3Model::call_rope(int64_t layer, bool forward, float* x, const Batch& b, int64_t heads,
                           int64_t ld) {
  const ops::RopeOp& op = rope_ops_[layer];
  try {
    (forward ? op.forward : op.backward)(x, b.B, b.S, heads, a_.head_dim, ld, b.positions,
                                         rope_.data());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a plugin kernel failing: say which one and where
    throw Error("RoPE op '" + op.name + "' failed in the " + (forward ? "forward" : "backward") +
                " of layer " + std::to_string(layer) + ": " + e.what());
  }
}

int64_t Qwen3Model::num_flop_params() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    if (p.alias) continue;
    if (p.fqn == "tok_embeddings.weight" && !a_.tie_embeddings) continue;
    n += p.numel;
  }
  return n;
}

double Qwen3Model::flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(num_flop_params()) +
         6.0 * static_cast<double>(a_.n_layers * a_.n_heads * 2 * a_.head_dim * seq_len);
}

}  // namespace titan::qwen3
