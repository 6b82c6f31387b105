#include "titan/models/qwen3/model.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/models/qwen3/hf_config.h"
#include "titan/models/qwen3/parallelize.h"
#include "titan/models/qwen3/state_dict_adapter.h"
#include "titan/ops/attention.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"
#include "titan/ops/router.h"

namespace titan::qwen3 {

void Qwen3Model::add_param(const std::string& fqn, std::vector<int64_t> shape, int64_t group,
                           int64_t* off) {
  const int split = tp_split_dim(fqn);
  ParamInfo p;
  p.fqn = fqn;
  p.shape = std::move(shape);
  const bool experts = fqn.find(".moe.experts.") != std::string::npos;
  if (experts && tp_.ep_active()) {  // whole experts of this ep rank (dimension 0)
    const models::ShardRange r = tp_.ep_shard(p.shape[0]);
    p.split_dim = 0;
    p.local_begin = r.begin;
    p.local_len = r.rows;
    p.split_over_ep = true;
  } else if (tp_.active() && split >= 0) {
    const models::ShardRange r = tp_.tp_shard(p.shape[static_cast<size_t>(split)]);
    p.split_dim = split;
    p.local_begin = r.begin;
    p.local_len = r.rows;
  }
  p.numel = 1;
  for (size_t i = 0; i < p.shape.size(); ++i)
    p.numel *= static_cast<int>(i) == p.split_dim ? p.local_len : p.shape[i];
  p.offset = *off;
  p.group = group;
  p.tp = tp_placement(fqn);
  *off += p.numel;
  params_.push_back(std::move(p));
}

Qwen3Model::Qwen3Model(const Qwen3Args& args, Qwen3Options opt)
    : a_(args),
      tp_(opt.tp),
      be_(ops::backend(opt.device, dtype_op_name(opt.compute))),
      mem_(be_.memory()),
      dev_(!mem_.host()),
      bf16_(opt.compute == DType::BF16),
      trainable_(opt.trainable),
      bf16_masters_(opt.bf16_masters),
      max_tokens_(opt.max_batch * opt.max_seq),
      max_batch_(opt.max_batch),
      max_seq_(opt.max_seq),
      max_positions_(opt.max_positions > 0 ? opt.max_positions : opt.max_seq),
      rope_ops_(std::move(opt.rope_ops)),
      experts_ops_(std::move(opt.experts_ops)) {
  hf_ = std::make_unique<Qwen3StateDictAdapter>(*this);
  ac_ = opt.ac;
  a_.validate();
  check(max_positions_ <= a_.max_seq_len, "training.seq_len " + std::to_string(max_positions_) +
                                              " exceeds the model's maximum context length " +
                                              std::to_string(a_.max_seq_len) +
                                              " (model.max_seq_len); lower training.seq_len");
  check(opt.loss_chunks > 0, "loss chunks must be positive");
  loss_chunk_rows_ = std::max<int64_t>(1, (max_tokens_ + opt.loss_chunks - 1) / opt.loss_chunks);
  // The spec checked the layout against the config; a direct caller is checked here.
  check_parallel_layout(a_, {tp_.size, tp_.ep_size, tp_.sequence_parallel, max_tokens_},
                        "the model");
  check(!dev_ || !(tp_.active() && tp_.ep_active()),
        "expert parallelism over the tensor-parallel ranks runs on the CPU only (device " +
            opt.device + "); use --training.device cpu, or EP over the data-parallel ranks");
  const SliceWidths w = slice_widths(a_, tp_);
  hq_ = w.hq, hkv_ = w.hkv, q_ = w.q, kv_ = w.kv, qkv_ = w.qkv, f_ = w.f, fm_ = w.fm;
  v0_ = w.v0, vl_ = w.vl;
  lay_out_params(opt.sharded);
  set_up_ops(opt.allocate);
  saved_.resize(static_cast<size_t>(a_.n_layers));
  // ---- the size table: every activation saved for the backward and every workspace, declared
  // once; the arenas are sized from it and carved in its order.
  std::vector<void**> slots;
  declare_tensors(&slots);
  if (!opt.allocate) return;  // a plan-only model: parameter list and size table, no storage
  allocate_buffers(slots);
}

// The parameters in flat order (this slice's, parallelize.h's plan) and the store over them.
void Qwen3Model::lay_out_params(bool sharded) {
  const int64_t D = a_.dim, V = a_.vocab_size, d = a_.head_dim, F = a_.hidden_dim;
  const int64_t L = a_.n_layers, E = a_.num_experts, Fm = a_.moe_hidden_dim;
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
    if (a_.moe_layer(l)) {
      ly.moe = static_cast<int64_t>(load_.size());
      load_.emplace_back(static_cast<size_t>(E), 0.0);
      ly.gate = off;
      add_param(p + "moe.router.gate.weight", {E, D}, l + 1, &off);
      ly.ew1 = off;
      add_param(p + "moe.experts.w1", {E, Fm, D}, l + 1, &off);
      ly.ew3 = off;
      add_param(p + "moe.experts.w3", {E, Fm, D}, l + 1, &off);
      ly.ew2 = off;
      add_param(p + "moe.experts.w2", {E, D, Fm}, l + 1, &off);
    } else {
      ly.w13 = off;
      add_param(p + "feed_forward.w1.weight", {F, D}, l + 1, &off);
      add_param(p + "feed_forward.w3.weight", {F, D}, l + 1, &off);
      ly.w2 = off;
      add_param(p + "feed_forward.w2.weight", {D, F}, l + 1, &off);
    }
    layers_.push_back(ly);
  }
  norm_ = off;
  add_param("norm.weight", {D}, L + 1, &off);
  if (a_.tie_embeddings) {
    ParamInfo p = params_[0];  // the embedding's storage (and slice)
    p.fqn = "lm_head.weight";
    p.alias = true;
    p.group = 0;
    params_.push_back(p);
    lm_head_ = tok_emb_;
  } else {
    lm_head_ = off;
    add_param("lm_head.weight", {V, D}, L + 1, &off);
  }
  // The store: a bf16 compute copy of all but an untied embedding (which is only looked up).
  models::ParamStore::Layout lay{off, models::param_units(params_),
                                 bf16_ && !a_.tie_embeddings ? vl_ * D : 0, copy_only_ranges()};
  store_.emplace(std::move(lay),
                 models::ParamStore::Options{bf16_, trainable_, sharded, bf16_masters_}, be_);
}

// The per-layer RoPE and experts ops (the built-ins where none was chosen), each on this
// model's device; the tables they read.
void Qwen3Model::set_up_ops(bool allocate) {
  const int64_t L = a_.n_layers, E = a_.num_experts, d = a_.head_dim;
  if (rope_ops_.empty()) rope_ops_.assign(static_cast<size_t>(L), ops::cos_sin_rope_op());
  check(static_cast<int64_t>(rope_ops_.size()) == L, "one RoPE op per layer is required");
  for (const auto& op : rope_ops_)  // the ops run on this model's memory
    check(op.device == be_.device, "RoPE op '" + op.name + "' runs on " + op.device +
                                       ", this model computes on " + be_.device);
  if (allocate) {
    rope_.resize(max_positions_ * d, mem_);
    be_.rope_table(max_positions_, d, a_.rope_theta, rope_.data());
  }
  const int64_t n_moe = static_cast<int64_t>(load_.size());
  if (n_moe > 0) {
    if (experts_ops_.empty())
      experts_ops_.assign(static_cast<size_t>(L),
                          bf16_ ? ops::grouped_experts_bf16_op() : ops::grouped_experts_op());
    check(static_cast<int64_t>(experts_ops_.size()) == L, "one experts op per layer is required");
    for (int64_t l = 0; l < L; ++l)
      check(!a_.moe_layer(l) || experts_ops_[l].device == be_.device,
            "experts op '" + experts_ops_[l].name + "' runs on " + experts_ops_[l].device +
                ", this model computes on " + be_.device);
    if (allocate) expert_bias_.resize(n_moe * E);
    aux_dp_.assign(static_cast<size_t>(E), 0.0f);
    aux_hits_.assign(static_cast<size_t>(E), 0.0);
    aux_psum_.assign(static_cast<size_t>(E), 0.0);
  }
}

// The store's buffers, the device's copies and the arenas carved in the size table's order.
void Qwen3Model::allocate_buffers(const std::vector<void**>& slots) {
  const int64_t L = a_.n_layers, E = a_.num_experts, D = a_.dim, d = a_.head_dim;
  const int64_t n_moe = static_cast<int64_t>(load_.size());
  store_->allocate();
  if (dev_) {
    batch_dev_.resize(3 * max_tokens_, mem_);
    if (n_moe > 0) {
      expert_bias_dev_.resize(n_moe * E, mem_);
      counts_dev_.resize(n_moe * E, mem_);
      stats_dev_.resize(2 * E, mem_);
      aux_dp_dev_.resize(E, mem_);
    }
  }
  int64_t bytes[2] = {0, 0};  // saved, work
  for (const auto& t : sizes_) bytes[t.saved ? 0 : 1] += t.aligned_bytes();
  acts_.reserve_bytes(bytes[0], mem_);
  work_.reserve_bytes(bytes[1], mem_);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    Arena& arena = sizes_[i].saved ? acts_ : work_;
    const int64_t n = sizes_[i].numel();
    switch (sizes_[i].dtype) {
      case DType::I32:
        *slots[i] = arena.take_as<int32_t>(n);
        break;
      case DType::BF16:
        *slots[i] = arena.take_as<uint16_t>(n);
        break;
      default:
        *slots[i] = arena.take_as<float>(n);
    }
  }
  // Blocks under activation checkpointing read what they recompute from the shared set.
  for (int64_t l = 0; l < L; ++l) {
    Saved& s = saved_[static_cast<size_t>(l)];
    const Saved& r = recompute_;
    if (ac_.full_block(l)) {
      float* x = s.x;
      s = r;
      s.x = x;
    } else if (ac_.mode == models::AcPolicy::Mode::op) {
      s.xn1 = r.xn1, s.rstd1 = r.rstd1, s.qr = r.qr, s.kr = r.kr, s.rstd_q = r.rstd_q;
      s.rstd_k = r.rstd_k, s.xn2 = r.xn2, s.rstd2 = r.rstd2;
      if (!a_.moe_layer(l)) s.g = r.g;
    }
  }
  seg_.resize(max_tokens_, mem_);
  if (tp_.active()) tp_gnorm_.resize(2 * D + 2 * d, mem_);
}

// Long because it is the size table: one line per activation and workspace of the model, in
// carving order, so the memory plan and the allocation read the same list.
void Qwen3Model::declare_tensors(std::vector<void**>* slots) {
  // Under tensor parallelism: this slice's widths; the residual stream (x, h, their norms'
  // statistics, h_final) on Tl tokens with sequence parallelism.
  const int64_t D = a_.dim, V = vl_, d = a_.head_dim, F = f_;
  const int64_t L = a_.n_layers, T = max_tokens_, Tl = local_tokens(max_tokens_);
  const int64_t E = a_.num_experts, K = a_.top_k, Fm = fm_;
  const int64_t Hq = hq_, Hkv = hkv_, QKV = qkv_, Q = q_, KV = kv_;
  const ops::ExpertsShape es{T, D, Fm, E, K};
  sizes_.clear();
  auto add = [&](const std::string& name, int64_t layer, bool saved, std::vector<int64_t> shape,
                 auto** dst) {
    using T0 = std::remove_pointer_t<std::remove_pointer_t<decltype(dst)>>;
    const DType dt = std::is_same_v<T0, int32_t>    ? DType::I32
                     : std::is_same_v<T0, uint16_t> ? DType::BF16
                                                    : DType::F32;
    sizes_.push_back({name, layer, saved, dt, std::move(shape), tp_split(name)});
    slots->push_back(reinterpret_cast<void**>(dst));
  };
  // Saved per layer (the forward's outputs the backward reads). Under activation checkpointing
  // what a block recomputes lives in one shared set (recompute_, a workspace): a fully
  // checkpointed block keeps only its input x, an "op" block its GEMM and attention outputs.
  using Mode = models::AcPolicy::Mode;
  const bool op = ac_.mode == Mode::op;
  bool shared_dense = false, shared_moe = false;  // which kinds of block use the shared set
  int64_t shared_experts = 0;                     // the experts state the shared set must hold
  for (int64_t l = 0; l < L; ++l) {
    Saved& s = saved_[static_cast<size_t>(l)];
    const bool moe = a_.moe_layer(l), full = ac_.full_block(l);
    add("x", l, true, {Tl, D}, &s.x);  // the layer's input (residual stream)
    if (full || op) (moe ? shared_moe : shared_dense) = true;
    if (full) {
      if (moe) shared_experts = std::max(shared_experts, experts_ops_[l].saved_floats(es));
      continue;
    }
    if (!op) {
      add("attention_norm.out", l, true, {T, D}, &s.xn1);
      add("attention_norm.rstd", l, true, {Tl}, &s.rstd1);
    }
    add("attention.qkv", l, true, {T, QKV}, &s.qkv);  // wq|wk|wv outputs
    if (!op) {
      add("attention.q", l, true, {T, Q}, &s.qr);   // q after q_norm and RoPE
      add("attention.k", l, true, {T, KV}, &s.kr);  // k after k_norm and RoPE
      add("attention.q_norm.rstd", l, true, {T, Hq}, &s.rstd_q);
      add("attention.k_norm.rstd", l, true, {T, Hkv}, &s.rstd_k);
    }
    add("attention.out", l, true, {T, Q}, &s.o);
    add("attention.lse", l, true, {T, Hq}, &s.lse);
    add("h", l, true, {Tl, D}, &s.hmid);  // x + attention
    if (!op) {
      add("ffn_norm.out", l, true, {T, D}, &s.xn2);
      add("ffn_norm.rstd", l, true, {Tl}, &s.rstd2);
    }
    if (moe) {
      add("moe.router.probs", l, true, {T, E}, &s.probs);
      add("moe.router.weights", l, true, {T, K}, &s.rw);
      sizes_.back().role = models::TensorSize::Role::routing_weights;
      add("moe.experts.saved", l, true, {experts_ops_[l].saved_floats(es)}, &s.experts);
      add("moe.router.indices", l, true, {T, K}, &s.idx);
    } else {
      add("feed_forward.w13", l, true, {T, 2 * F}, &s.ab);
      if (!op) add("feed_forward.hidden", l, true, {T, F}, &s.g);
    }
  }
  if (shared_dense || shared_moe) {
    Saved& r = recompute_;
    const bool full = ac_.mode == Mode::full;
    add("recompute.attention_norm.out", -1, false, {T, D}, &r.xn1);
    add("recompute.attention_norm.rstd", -1, false, {Tl}, &r.rstd1);
    if (full) add("recompute.attention.qkv", -1, false, {T, QKV}, &r.qkv);
    add("recompute.attention.q", -1, false, {T, Q}, &r.qr);
    add("recompute.attention.k", -1, false, {T, KV}, &r.kr);
    add("recompute.attention.q_norm.rstd", -1, false, {T, Hq}, &r.rstd_q);
    add("recompute.attention.k_norm.rstd", -1, false, {T, Hkv}, &r.rstd_k);
    if (full) {
      add("recompute.attention.out", -1, false, {T, Q}, &r.o);
      add("recompute.attention.lse", -1, false, {T, Hq}, &r.lse);
      add("recompute.h", -1, false, {Tl, D}, &r.hmid);
    }
    add("recompute.ffn_norm.out", -1, false, {T, D}, &r.xn2);
    add("recompute.ffn_norm.rstd", -1, false, {Tl}, &r.rstd2);
    if (full && shared_moe) {
      add("recompute.moe.router.probs", -1, false, {T, E}, &r.probs);
      add("recompute.moe.router.weights", -1, false, {T, K}, &r.rw);
      sizes_.back().role = models::TensorSize::Role::routing_weights;
      add("recompute.moe.experts.saved", -1, false, {shared_experts}, &r.experts);
      add("recompute.moe.router.indices", -1, false, {T, K}, &r.idx);
    }
    if (full && shared_dense) add("recompute.feed_forward.w13", -1, false, {T, 2 * F}, &r.ab);
    if (shared_dense) add("recompute.feed_forward.hidden", -1, false, {T, F}, &r.g);
  }
  add("h_final", -1, true, {Tl, D}, &h_final_);
  add("norm.out", -1, true, {T, D}, &xf_);
  add("norm.rstd", -1, true, {Tl}, &rstd_f_);
  // Workspaces shared by all layers.
  ops::AttnShape as{max_batch_, max_seq_, Hq, Hkv, d, 1.f, Q, KV, QKV};
  add("tmp", -1, false, {T, D}, &tmp_);
  add("grad.x", -1, false, {T, D}, &dx_);
  add("grad.norm_in", -1, false, {T, D}, &dxn_);
  add("grad.qkv", -1, false, {T, QKV}, &dqkv_);
  add("grad.q", -1, false, {T, Q}, &dq_);
  add("grad.k", -1, false, {T, KV}, &dkr_);
  add("grad.attention_out", -1, false, {T, Q}, &do_);
  add("grad.w13", -1, false, {T, 2 * F}, &dab_);
  add("grad.hidden", -1, false, {T, F}, &dg_);
  add("attention.scratch", -1, false, {be_.attention_workspace(as)}, &attn_scratch_);
  add("rmsnorm.scratch", -1, false,
      {std::max(ops::rmsnorm_bwd_scratch({T, 1, D, D, D}),
                ops::rmsnorm_bwd_scratch({T, Hq, d, QKV, Q}))},
      &norm_scratch_);
  add("attention.delta", -1, false, {T, Hq}, &delta_);
  add("loss.scratch", -1, false,
      {tp_.active() ? ops::lm_head_ce_vocab_parallel_scratch(T, V, D, loss_chunk_rows_, bf16_)
       : bf16_      ? ops::lm_head_ce_bf16_scratch(T, V, D, loss_chunk_rows_)
                    : ops::lm_head_ce_scratch(T, V, loss_chunk_rows_)},
      &loss_scratch_);
  sizes_.back().role = models::TensorSize::Role::loss_scratch;
  if (tp_.active()) add("tp.buffer", -1, false, {T, D}, &tp_buf_);
  if (bf16_)  // the bf16 operands of the widest projection's backward: M·(in + out)
    add("linear.bf16_operands", -1, false, {T * std::max({D + QKV, Q + D, D + 2 * F, F + D})},
        &lin_scratch_);
  if (!load_.empty()) {
    int64_t experts_scratch = 0;  // the largest any layer's experts op asks for
    for (int64_t l = 0; l < L; ++l)
      if (a_.moe_layer(l))
        experts_scratch = std::max(experts_scratch, experts_ops_[l].scratch_floats(es));
    add("grad.routing_weights", -1, false, {T, K}, &dw_route_);
    add("moe.router.logits", -1, false, {T, E}, &dlogits_);  // and their gradient
    add("moe.experts.scratch", -1, false, {experts_scratch}, &experts_scratch_);
    add("moe.aux.indices", -1, false, {T, K}, &aux_idx_);
  }
}

void Qwen3Model::init_weights(uint64_t seed, float std, int64_t unit) {
  float* P = store_->param_data();  // the host's (sent to a device before its next use)
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (p.alias || (unit >= 0 && p.group != unit)) continue;
    float* w = P + p.offset;
    if (p.shape.size() == 1) {
      std::fill_n(w, p.numel, 1.0f);  // RMSNorm weights
    } else if (p.split_dim >= 0) {    // a tensor-parallel slice: the whole tensor's values
      int64_t outer = 1, inner = 1;   // [outer, extent, inner] around the split dimension
      for (size_t k = 0; k < p.shape.size(); ++k) {
        if (static_cast<int>(k) < p.split_dim) outer *= p.shape[k];
        if (static_cast<int>(k) > p.split_dim) inner *= p.shape[k];
      }
      const int64_t extent = p.shape[static_cast<size_t>(p.split_dim)];
      const int64_t run = p.local_len * inner;
      for (int64_t o = 0; o < outer; ++o)
        fill_normal_range(w + o * run, (o * extent + p.local_begin) * inner, run, 0.0f, std, seed,
                          i);
    } else {
      // The tied embedding is the lm_head weight: it gets the Linear init (same N(0, std)).
      fill_normal(w, p.numel, 0.0f, std, seed, i);
    }
  }
}

void Qwen3Model::linear(const float* x, int64_t w, float* y, int64_t M, int64_t in, int64_t out) {
  if (bf16_)
    be_.linear_fwd_bf16(x, weight_bf16(w), y, M, in, out, lin_scratch_);
  else
    be_.linear_fwd(x, store_->weights() + w, y, M, in, out);
  if (lin_hooks_) lin_hooks_->forward(w, x, y, M, in, out);
}

void Qwen3Model::linear_back(const float* dy, const float* x, int64_t w, float* dx, int64_t M,
                             int64_t in, int64_t out) {
  float* dw = grad_at(w);
  if (bf16_)
    be_.linear_bwd_bf16(dy, x, weight_bf16(w), dx, dw, M, in, out, false, lin_scratch_);
  else
    be_.linear_bwd(dy, x, store_->weights() + w, dx, dw, M, in, out, false);
  if (lin_hooks_) lin_hooks_->backward(w, dy, x, dx, M, in, out);
}

ops::LossSum Qwen3Model::forward_backward(const Batch& b, float grad_scale, float aux_weight) {
  return run(b, grad_scale, aux_weight, true);
}

ops::LossSum Qwen3Model::forward_loss(const Batch& b) { return run(b, 0.0f, 0.0f, false); }

void Qwen3Model::forward_logits(const Batch& b, float* out) {
  if (!dev_) {
    run(b, 0.0f, 0.0f, false, out);
    return;
  }
  Buffer<float> logits;  // on the device, then copied to the host's out
  logits.resize(b.B * b.S * a_.vocab_size, mem_);
  run(b, 0.0f, 0.0f, false, logits.data());
  be_.copy(out, logits.data(), sizeof(float) * static_cast<size_t>(logits.size()));
}

models::Batch Qwen3Model::device_batch(const Batch& b) {
  if (!dev_) return b;
  const int64_t T = b.B * b.S;
  const size_t bytes = sizeof(int32_t) * static_cast<size_t>(T);
  Batch d = b;
  int32_t* at = batch_dev_.data();
  for (const int32_t** p : {&d.input, &d.labels, &d.positions}) {
    if (*p) {
      be_.copy(at, *p, bytes);
      *p = at;
    }
    at += max_tokens_;
  }
  return d;
}

void Qwen3Model::fetch_counts() {
  const int64_t E = a_.num_experts;
  std::vector<double>& c = counts_host_;  // sized once
  c.resize(static_cast<size_t>(counts_dev_.size()));
  be_.copy(c.data(), counts_dev_.data(), sizeof(double) * c.size());
  counts_dev_.zero();
  for (size_t m = 0; m < load_.size(); ++m)
    for (int64_t e = 0; e < E; ++e)
      load_[m][static_cast<size_t>(e)] += c[m * static_cast<size_t>(E) + static_cast<size_t>(e)];
}

// The block's forward: saved_[l] gets what its backward reads; out = its output.
void Qwen3Model::layer_forward(int64_t l, const Batch& b, float* out, bool count,
                               const Cached* cached) {
  const int64_t T = b.B * b.S, Tl = local_tokens(T), D = a_.dim, F = f_, d = a_.head_dim;
  const int64_t Hq = hq_, Hkv = hkv_, Q = q_, KV = kv_, QKV = qkv_;
  const float eps = a_.norm_eps;
  const float* P = store_->weights();
  const ops::AttnShape as{b.B, b.S, Hq, Hkv, d, 1.0f / std::sqrt(static_cast<float>(d)),
                          Q,   KV,  QKV};
  const ops::NormRows qrows{T, Hq, d, QKV, Q};
  const ops::NormRows krows{T, Hkv, d, QKV, KV};
  const Layer& w = layers_[l];
  Saved& s = saved_[l];
  norm_gathered(Tl, s.x, w.attention_norm, s.xn1, s.rstd1);
  linear(s.xn1, w.wqkv, s.qkv, T, D, QKV);
  be_.rmsnorm_fwd(qrows, s.qkv, P + w.q_norm, eps, s.qr, s.rstd_q);
  be_.rmsnorm_fwd(krows, s.qkv + Q, P + w.k_norm, eps, s.kr, s.rstd_k);
  call_rope(l, true, s.qr, b, Hq, Q);
  call_rope(l, true, s.kr, b, Hkv, KV);
  if (cached) {  // generation: append the new keys and values, attend to the cache
    const Cached& c = *cached;
    const size_t row = sizeof(float) * static_cast<size_t>(KV);
    for (int64_t t = 0; t < T; ++t) {
      be_.copy(c.k + c.row[t] * KV, s.kr + t * KV, row);
      be_.copy(c.v + c.row[t] * KV, s.qkv + t * QKV + Q + KV, row);
      c.kp[t] = c.k + c.seq_row[t] * KV;  // addresses in the model's memory, made here
      c.vp[t] = c.v + c.seq_row[t] * KV;
    }
    const float* const* kp = c.kp;
    const float* const* vp = c.vp;
    if (c.kv_dev) {  // the pointer arrays where the kernel reads them
      be_.copy(c.kv_dev, c.kp, sizeof(float*) * static_cast<size_t>(T));
      be_.copy(c.kv_dev + T, c.vp, sizeof(float*) * static_cast<size_t>(T));
      kp = c.kv_dev;
      vp = c.kv_dev + T;
    }
    be_.attention_cached(s.qr, Q, kp, vp, c.n_keys, KV, T, Hq, Hkv, d, as.scale, s.o);
  } else {
    cp_.forward(be_, as, s.qr, s.kr, s.qkv + Q + KV, seg_.data(), s.o, s.lse, attn_scratch_);
  }
  linear(s.o, w.wo, tmp_, T, Q, D);
  be_.add(s.x, reduce_.forward(tmp_, tp_buf_, T), s.hmid, Tl * D);
  ffn_norm(l, Tl, s);
  const bool local = w.moe >= 0 && moe_local();
  if (w.moe >= 0) {
    const Rows m = moe_rows(T);
    if (local && !tp_.sequence_parallel) be_.memset(tmp_, 0, sizeof(float) * T * D);
    moe_forward(l, m, tmp_ + m.begin * D, count);
  } else {
    linear(s.xn2, w.w13, s.ab, T, D, 2 * F);
    be_.swiglu_fwd(s.ab, s.g, T, F);
    linear(s.g, w.w2, tmp_, T, F, D);
  }
  // A local MoE layer under SP computed this rank's rows whole.
  be_.add(s.hmid, local && tp_.sequence_parallel ? tmp_ : reduce_.forward(tmp_, tp_buf_, T), out,
          Tl * D);
}

Qwen3Model::Rows Qwen3Model::moe_rows(int64_t T) const {
  if (!moe_local()) return {0, T};
  if (tp_.sequence_parallel) return {0, local_tokens(T)};
  const models::ShardRange r = tp_.token_block(T);  // T % tp checked with the layout
  return {r.begin, r.rows};
}

void Qwen3Model::ffn_norm(int64_t l, int64_t Tl, Saved& s) {
  const Layer& w = layers_[l];
  if (w.moe >= 0 && moe_local() && tp_.sequence_parallel)
    be_.rmsnorm_fwd({Tl, 1, a_.dim, a_.dim, a_.dim}, s.hmid, store_->weights() + w.ffn_norm,
                    a_.norm_eps, s.xn2, s.rstd2);
  else
    norm_gathered(Tl, s.hmid, w.ffn_norm, s.xn2, s.rstd2);
}

void Qwen3Model::norm_gathered(int64_t Tl, const float* x, int64_t w, float* out, float* rstd) {
  const int64_t D = a_.dim;
  float* local = gather_.local(out, tmp_);
  be_.rmsnorm_fwd({Tl, 1, D, D, D}, x, store_->weights() + w, a_.norm_eps, local, rstd);
  gather_.forward(local, out, Tl * tp_.size);
}

void Qwen3Model::set_tp_group(models::TpHooks* h, const models::TpRegion& region) {
  tp_hooks_ = h;
  gather_ = models::GatherSequence(region);
  reduce_ = models::ReducePartial(region);
}

void Qwen3Model::reduce_norm_grads(const int64_t* offsets, const int64_t* lens, int n,
                                   int n_residual) {
  // Sequence parallelism: the residual stream's norms (the first n_residual slots) have partial
  // weight gradients, over this rank's tokens; q_norm/k_norm's (the others) always do, over this
  // rank's heads.
  int64_t total = 0, residual = 0;
  for (int i = 0; i < n; ++i) {
    total += lens[i];
    if (i < n_residual) residual += lens[i];
  }
  if (tp_.sequence_parallel)
    tp_hooks_->all_reduce(tp_gnorm_.data(), total);
  else if (total > residual)
    tp_hooks_->all_reduce(tp_gnorm_.data() + residual, total - residual);
  const float* g = tp_gnorm_.data();
  for (int i = 0; i < n; ++i) {
    be_.add_inplace(store_->grads() + offsets[i], g, lens[i]);
    g += lens[i];
  }
}

void Qwen3Model::embedding_forward(const int32_t* ids, int64_t T, float* out) {
  const int64_t D = a_.dim, V = a_.vocab_size;
  const float* table = store_->weights() + tok_emb_;
  if (!tp_.active()) {
    be_.embedding_fwd(ids, T, table, V, D, out);
    return;
  }
  // Vocab-parallel: the rows of this rank's vocabulary, zeros elsewhere, summed over the group.
  be_.embedding_fwd_range(ids, T, table, V, v0_, vl_, D, tmp_);
  be_.copy(out, reduce_.forward(tmp_, tp_buf_, T), local_tokens(T) * D * sizeof(float));
}

void Qwen3Model::embedding_backward(const int32_t* ids, int64_t T) {
  const int64_t D = a_.dim;
  if (!tp_.active()) {
    be_.embedding_bwd(ids, T, dx_, D, grad_at(tok_emb_));
    return;
  }
  // The gradient rows of the tokens in this rank's vocabulary rows.
  be_.embedding_bwd_range(ids, T, reduce_.backward(dx_, tp_buf_, T), v0_, vl_, D,
                          grad_at(tok_emb_));
}

// Selective AC "op": the block's norms, RoPE and SwiGLU from its kept inputs (x, qkv, h, w13).
void Qwen3Model::recompute_cheap(int64_t l, const Batch& b) {
  const int64_t T = b.B * b.S, Tl = local_tokens(T), F = f_, d = a_.head_dim;
  const int64_t Hq = hq_, Hkv = hkv_, Q = q_, KV = kv_, QKV = qkv_;
  const float eps = a_.norm_eps;
  const float* P = store_->weights();
  const Layer& w = layers_[l];
  Saved& s = saved_[l];
  norm_gathered(Tl, s.x, w.attention_norm, s.xn1, s.rstd1);
  be_.rmsnorm_fwd({T, Hq, d, QKV, Q}, s.qkv, P + w.q_norm, eps, s.qr, s.rstd_q);
  be_.rmsnorm_fwd({T, Hkv, d, QKV, KV}, s.qkv + Q, P + w.k_norm, eps, s.kr, s.rstd_k);
  call_rope(l, true, s.qr, b, Hq, Q);
  call_rope(l, true, s.kr, b, Hkv, KV);
  ffn_norm(l, Tl, s);
  if (w.moe < 0) be_.swiglu_fwd(s.ab, s.g, T, F);
}

// The block's backward: dx_ (in: dL/d output, out: dL/d input); parameter gradients accumulate.
void Qwen3Model::layer_backward(int64_t l, const Batch& b) {
  const int64_t T = b.B * b.S, Tl = local_tokens(T), D = a_.dim, F = f_, d = a_.head_dim;
  const int64_t Hq = hq_, Hkv = hkv_, Q = q_, KV = kv_, QKV = qkv_;
  const float* P = store_->weights();
  const ops::AttnShape as{b.B, b.S, Hq, Hkv, d, 1.0f / std::sqrt(static_cast<float>(d)),
                          Q,   KV,  QKV};
  const ops::NormRows rows{Tl, 1, D, D, D};
  const ops::NormRows qrows{T, Hq, d, QKV, Q};
  const ops::NormRows krows{T, Hkv, d, QKV, KV};
  const Layer& w = layers_[l];
  Saved& s = saved_[l];
  // Tensor parallelism: the replicated norms' weight gradients of this backward are collected in
  // tp_gnorm_ (attention_norm, ffn_norm, q_norm, k_norm) and reduced at the end.
  const bool tp_norms = tp_.active() && trainable_;
  if (tp_norms) tp_gnorm_.zero();
  auto norm_grad = [&](int64_t off, int64_t slot) {
    return tp_norms ? tp_gnorm_.data() + slot : grad_at(off);
  };
  const bool local = w.moe >= 0 && moe_local();
  if (w.moe >= 0) {
    // out = hmid + moe(norm(hmid)); a local layer: this rank's rows (the others' dxn zero)
    const Rows m = moe_rows(T);
    if (local && !tp_.sequence_parallel) be_.memset(dxn_, 0, sizeof(float) * T * D);
    moe_backward(l, m, local ? dx_ + m.begin * D : reduce_.backward(dx_, tp_buf_, T),
                 dxn_ + m.begin * D);
  } else {
    // out = hmid + w2·swiglu(w13·norm(hmid))
    linear_back(reduce_.backward(dx_, tp_buf_, T), s.g, w.w2, dg_, T, F, D);
    be_.swiglu_bwd(dg_, s.ab, dab_, T, F);
    linear_back(dab_, s.xn2, w.w13, dxn_, T, D, 2 * F);
  }
  be_.rmsnorm_bwd(rows, local && tp_.sequence_parallel ? dxn_ : gather_.backward(dxn_, tp_buf_, T),
                  s.hmid, P + w.ffn_norm, s.rstd2, tmp_, norm_grad(w.ffn_norm, D), norm_scratch_);
  be_.add_inplace(dx_, tmp_, Tl * D);
  // hmid = x + wo·attention(rope(q_norm(q)), rope(k_norm(k)), v)
  linear_back(reduce_.backward(dx_, tp_buf_, T), s.o, w.wo, do_, T, Q, D);
  cp_.backward(be_, as, s.qr, s.kr, s.qkv + Q + KV, s.o, s.lse, do_, seg_.data(), dq_, dkr_,
               dqkv_ + Q + KV, delta_, attn_scratch_);
  call_rope(l, false, dq_, b, Hq, Q);
  call_rope(l, false, dkr_, b, Hkv, KV);
  be_.rmsnorm_bwd(qrows, dq_, s.qkv, P + w.q_norm, s.rstd_q, dqkv_, norm_grad(w.q_norm, 2 * D),
                  norm_scratch_);
  be_.rmsnorm_bwd(krows, dkr_, s.qkv + Q, P + w.k_norm, s.rstd_k, dqkv_ + Q,
                  norm_grad(w.k_norm, 2 * D + d), norm_scratch_);
  linear_back(dqkv_, s.xn1, w.wqkv, dxn_, T, D, QKV);
  be_.rmsnorm_bwd(rows, gather_.backward(dxn_, tp_buf_, T), s.x, P + w.attention_norm, s.rstd1,
                  tmp_, norm_grad(w.attention_norm, 0), norm_scratch_);
  be_.add_inplace(dx_, tmp_, Tl * D);
  if (tp_norms) {
    const int64_t offsets[] = {w.attention_norm, w.ffn_norm, w.q_norm, w.k_norm};
    const int64_t lens[] = {D, D, d, d};
    reduce_norm_grads(offsets, lens, 4, 2);
  }
}

// The whole pass, forward then backward, in one function so the order of the parameter-store
// calls (acquire/release per unit, which FSDP turns into collectives every rank must match) and the
// tensor-parallel reductions reads top to bottom.
ops::LossSum Qwen3Model::run(const Batch& hb, float grad_scale, float aux_weight, bool backward,
                             float* logits_out) {
  check(hb.B <= max_batch_ && hb.S <= max_seq_ && hb.B * hb.S <= max_tokens_,
        "microbatch of " + std::to_string(hb.B) + "x" + std::to_string(hb.S) +
            " exceeds the model's allocated " + std::to_string(max_batch_) + "x" +
            std::to_string(max_seq_));
  store_->sync_device();
  const Batch b = device_batch(hb);  // checked first: it fills slots of max_tokens_
  if (const int64_t bad = be_.first_bad_position(b.positions, b.B * b.S, max_positions_);
      bad >= 0) {
    int32_t pos = 0;
    be_.copy(&pos, b.positions + bad, sizeof pos);
    throw Error("position " + std::to_string(pos) + " is outside the RoPE table of " +
                std::to_string(max_positions_));
  }
  const int64_t T = b.B * b.S, Tl = local_tokens(T), D = a_.dim, V = a_.vocab_size;
  const float* P = store_->weights();
  const int64_t head = a_.n_layers + 1;  // the head's unit; a tied lm_head also reads unit 0
  const ops::NormRows rows{Tl, 1, D, D, D};
  if (tp_.active()) {
    check(tp_hooks_ != nullptr, "a tensor-parallel model runs with its group's hooks");
    check(!tp_.sequence_parallel || T % tp_.size == 0,
          "sequence parallelism: " + std::to_string(T) +
              " tokens per microbatch are not divisible by the tensor-parallel degree " +
              std::to_string(tp_.size));
    check(!logits_out, "all logits of a tensor-parallel model are not formed on one rank");
  }
  cp_.segments(be_, b.positions, b.B, b.S, a_.attn_mask_type == "block_causal", seg_.data());

  // ---------------- forward
  const bool aux = a_.router_aux_loss && !load_.empty();
  aux_loss_ = 0;
  if (aux) {
    std::fill(aux_hits_.begin(), aux_hits_.end(), 0.0);
    std::fill(aux_psum_.begin(), aux_psum_.end(), 0.0);
    stats_dev_.zero();
  }
  if (dev_ && a_.load_balance_coeff > 0 && !load_.empty())
    be_.copy(expert_bias_dev_.data(), expert_bias_.data(),
             sizeof(float) * static_cast<size_t>(expert_bias_.size()));
  store_->begin_pass(backward && !logits_out);
  acquire(0, false);
  embedding_forward(b.input, T, saved_[0].x);
  release(0, false);
  for (int64_t l = 0; l < a_.n_layers; ++l) {
    acquire(l + 1, false);
    layer_forward(l, b, l + 1 < a_.n_layers ? saved_[l + 1].x : h_final_, backward);
    release(l + 1, false);
    if (aux && layers_[l].moe >= 0) aux_accumulate(l, moe_rows(T).n);
  }
  if (aux) aux_finish(T, backward, aux_weight);
  if (dev_ && backward && !load_.empty()) fetch_counts();
  acquire(head, false);
  if (a_.tie_embeddings) acquire(0, false);
  auto release_head = [&](bool bwd) {
    release(head, bwd);
    if (a_.tie_embeddings) release(0, bwd);
  };
  norm_gathered(Tl, h_final_, norm_, xf_, rstd_f_);
  if (logits_out) {
    linear(xf_, lm_head_, logits_out, T, D, V);
    release_head(false);
    return {};
  }
  const float gs = backward ? grad_scale : 0.0f;
  float* dh = backward ? dxn_ : nullptr;
  float* dw = backward ? grad_at(lm_head_) : nullptr;
  ops::LossSum loss;
  if (tp_.active()) {  // loss parallelism: this rank's vocabulary rows (dh partial, reduced below)
    struct Reducer final : ops::RankReducer {
      models::TpHooks* h;
      explicit Reducer(models::TpHooks* hooks) : h(hooks) {}
      void sum(float* x, int64_t n) override { h->all_reduce(x, n); }
      void max(float* x, int64_t n) override { h->all_reduce_max(x, n); }
    } red(tp_hooks_);
    loss = be_.lm_head_ce_vocab_parallel(xf_, P + lm_head_, bf16_ ? weight_bf16(lm_head_) : nullptr,
                                         b.labels, T, D, V, v0_, vl_, loss_chunk_rows_, gs, dh, dw,
                                         loss_scratch_, red);
  } else {
    loss = bf16_ ? be_.lm_head_ce_bf16(xf_, weight_bf16(lm_head_), b.labels, T, D, V,
                                       loss_chunk_rows_, gs, dh, dw, loss_scratch_)
                 : be_.lm_head_ce(xf_, P + lm_head_, b.labels, T, D, V, loss_chunk_rows_, gs, dh,
                                  dw, loss_scratch_);
  }
  if (!backward) {
    release_head(false);
    return loss;
  }

  // ---------------- backward (dx_ = dL/d(residual stream) flowing down); the head's forward
  // and backward are one use of its unit
  {
    const bool tp_norm = tp_.active() && trainable_;
    if (tp_norm) be_.memset(tp_gnorm_.data(), 0, sizeof(float) * static_cast<size_t>(D));
    be_.rmsnorm_bwd(rows, gather_.backward(dxn_, tp_buf_, T), h_final_, P + norm_, rstd_f_, dx_,
                    tp_norm ? tp_gnorm_.data() : grad_at(norm_), norm_scratch_);
    if (tp_norm) {
      const int64_t offsets[] = {norm_}, lens[] = {D};
      reduce_norm_grads(offsets, lens, 1, 1);
    }
  }
  release_head(true);
  grads_ready(head);
  for (int64_t l = a_.n_layers - 1; l >= 0; --l) {
    acquire(l + 1, true);
    // Activation checkpointing: a fully checkpointed block runs its forward again from its saved
    // input (into the shared buffers; the output is not needed); with "op", the norms, RoPE and
    // SwiGLU are recomputed from the kept GEMM and attention outputs. Same kernels, same inputs:
    // the same bits as the first forward.
    if (ac_.full_block(l)) {
      layer_forward(l, b, dxn_, /*count=*/false);
    } else if (ac_.mode == models::AcPolicy::Mode::op) {
      recompute_cheap(l, b);
    }
    layer_backward(l, b);
    release(l + 1, true);
    grads_ready(l + 1);
  }
  if (trainable_) embedding_backward(b.input, T);  // reads no weights
  grads_ready(0);
  return loss;
}

namespace {
class Qwen3KvCache final : public models::KvCache {
 public:
  Qwen3KvCache(int64_t layers, int64_t n_seq, int64_t max_len, int64_t kv_dim,
               const DeviceMemory& mem)
      : n_seq_(n_seq), cap_(max_len), len_(static_cast<size_t>(n_seq), 0), mem_(mem) {
    k_.resize(layers * n_seq * max_len * kv_dim, mem);
    v_.resize(layers * n_seq * max_len * kv_dim, mem);
  }
  // Off the CPU: device arrays for n new tokens' key counts and key/value pointers, and for
  // the logits of one step (a row per sequence).
  void reserve(int64_t n, int64_t vocab) {
    if (logits_.size() < n_seq_ * vocab) logits_.resize(n_seq_ * vocab, mem_);
    if (n_keys_.size() >= n) return;
    n_keys_.resize(n, mem_);
    ptrs_.resize(2 * n, mem_);
  }
  int64_t sequences() const override { return n_seq_; }
  int64_t capacity() const override { return cap_; }
  int64_t length(int64_t seq) const override { return len_.at(static_cast<size_t>(seq)); }
  void clear(int64_t seq) override { len_.at(static_cast<size_t>(seq)) = 0; }

  int64_t n_seq_, cap_;
  std::vector<int64_t> len_;
  DeviceMemory mem_;
  Buffer<float> k_, v_;  // [layers, n_seq, max_len, kv_dim]
  Buffer<int32_t> n_keys_;
  Buffer<const float*> ptrs_;
  Buffer<float> logits_;
};
}  // namespace

std::unique_ptr<models::KvCache> Qwen3Model::new_kv_cache(int64_t n_seq, int64_t max_len) {
  check(!tp_.active(), "generation runs on a whole model, not a tensor-parallel slice");
  check(n_seq >= 1 && max_len >= 1, "a key/value cache needs at least one sequence and token");
  check(max_len <= max_seq_, "a key/value cache of " + std::to_string(max_len) +
                                 " tokens per sequence exceeds the model's positions (built for " +
                                 std::to_string(max_seq_) + ")");
  return std::make_unique<Qwen3KvCache>(a_.n_layers, n_seq, max_len, a_.kv_dim(), mem_);
}

int64_t Qwen3Model::forward_cached(models::KvCache& kc, const int32_t* tokens, const int32_t* seq,
                                   int64_t n, float* logits) {
  auto* c = dynamic_cast<Qwen3KvCache*>(&kc);
  check(c, "forward_cached: the cache was not made by this model");
  check(n >= 1 && n <= max_tokens_, "forward_cached: " + std::to_string(n) +
                                        " new tokens; at most " + std::to_string(max_tokens_) +
                                        " per call");
  const int64_t D = a_.dim, V = a_.vocab_size, KV = a_.kv_dim(), cap = c->cap_;
  const auto T = static_cast<size_t>(n);
  std::vector<int64_t> len = c->len_, row(T), seq_row(T), last;  // last: per output row, token
  std::vector<int32_t> pos(T), n_keys(T);
  std::vector<const float*> kp(T), vp(T);
  std::vector<int64_t> out_of(static_cast<size_t>(c->n_seq_), -1);  // sequence → output row
  for (size_t i = 0; i < T; ++i) {
    const int64_t sq = seq[i];
    check(sq >= 0 && sq < c->n_seq_, "forward_cached: sequence " + std::to_string(sq) +
                                         " outside the cache's " + std::to_string(c->n_seq_));
    check(tokens[i] >= 0 && tokens[i] < V, "forward_cached: token id " + std::to_string(tokens[i]) +
                                               " outside the vocabulary of " + std::to_string(V));
    auto& l = len[static_cast<size_t>(sq)];
    check(l < cap, "forward_cached: sequence " + std::to_string(sq) + " is full (" +
                       std::to_string(cap) + " tokens)");
    pos[i] = static_cast<int32_t>(l);
    n_keys[i] = static_cast<int32_t>(l + 1);
    seq_row[i] = sq * cap;
    row[i] = sq * cap + l++;
    auto& r = out_of[static_cast<size_t>(sq)];
    if (r < 0) {
      r = static_cast<int64_t>(last.size());
      last.push_back(0);
    }
    last[static_cast<size_t>(r)] = static_cast<int64_t>(i);
  }
  store_->sync_device();
  const Batch b = device_batch({1, n, tokens, nullptr, pos.data()});
  const int32_t* keys = n_keys.data();
  const float** kv_dev = nullptr;
  if (dev_) {
    c->reserve(n, V);
    be_.copy(c->n_keys_.data(), n_keys.data(), sizeof(int32_t) * T);
    keys = c->n_keys_.data();
    kv_dev = c->ptrs_.data();
  }
  const float* P = store_->weights();
  store_->begin_pass(false);
  acquire(0, false);
  be_.embedding_fwd(b.input, n, P + tok_emb_, V, D, saved_[0].x);
  release(0, false);
  const int64_t layer_rows = c->n_seq_ * cap * KV;
  for (int64_t l = 0; l < a_.n_layers; ++l) {
    const Cached cached{c->k_.data() + l * layer_rows,
                        c->v_.data() + l * layer_rows,
                        row.data(),
                        seq_row.data(),
                        keys,
                        kp.data(),
                        vp.data(),
                        kv_dev};
    acquire(l + 1, false);
    layer_forward(l, b, l + 1 < a_.n_layers ? saved_[l + 1].x : h_final_, false, &cached);
    release(l + 1, false);
  }
  // The final norm and the lm_head of each sequence's last new token only.
  const auto R = static_cast<int64_t>(last.size());
  for (int64_t r = 0; r < R; ++r)
    be_.copy(tmp_ + r * D, h_final_ + last[static_cast<size_t>(r)] * D, sizeof(float) * D);
  const int64_t head = a_.n_layers + 1;
  acquire(head, false);
  if (a_.tie_embeddings) acquire(0, false);
  be_.rmsnorm_fwd({R, 1, D, D, D}, tmp_, P + norm_, a_.norm_eps, xf_, rstd_f_);
  // off the CPU: computed in the cache's scratch, then copied to the host's
  linear(xf_, lm_head_, dev_ ? c->logits_.data() : logits, R, D, V);
  if (dev_) be_.copy(logits, c->logits_.data(), sizeof(float) * static_cast<size_t>(R * V));
  release(head, false);
  if (a_.tie_embeddings) release(0, false);
  c->len_ = std::move(len);
  return R;
}

std::vector<models::FlatRange> Qwen3Model::copy_only_ranges() const {
  std::vector<models::FlatRange> r;
  if (!bf16_ || (trainable_ && !bf16_masters_)) return r;
  const int64_t D = a_.dim, F = f_;
  for (const Layer& w : layers_) {
    r.push_back({w.wqkv, qkv_ * D});
    r.push_back({w.wo, D * q_});
    if (w.moe < 0) {
      r.push_back({w.w13, 2 * F * D});
      r.push_back({w.w2, D * F});
    }
  }
  if (!a_.tie_embeddings) r.push_back({lm_head_, vl_ * D});  // a tied one is looked up
  return r;
}

namespace {
// Runs a (possibly plugin) kernel; a non-titan exception becomes one error naming the op, the
// direction and the layer.
template <typename Fn>
void guarded(const char* kind, const std::string& op, bool forward, int64_t layer, Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string(kind) + " op '" + op + "' failed in the " +
                (forward ? "forward" : "backward") + " of layer " + std::to_string(layer) + ": " +
                e.what());
  }
}
}  // namespace

void Qwen3Model::call_rope(int64_t layer, bool forward, float* x, const Batch& b, int64_t heads,
                           int64_t ld) {
  const ops::RopeOp& op = rope_ops_[layer];
  guarded("RoPE", op.name, forward, layer, [&] {
    (forward ? op.forward : op.backward)(x, b.B, b.S, heads, a_.head_dim, ld, b.positions,
                                         rope_.data());
  });
}

ops::ExpertsArgs Qwen3Model::experts_args(int64_t l, const Rows& m) {
  const Layer& w = layers_[l];
  const Saved& s = saved_[l];
  const float* P = store_->weights();
  ops::ExpertsArgs ea;
  ea.s = {m.n, a_.dim, fm_, a_.num_experts, a_.top_k};
  ea.x = s.xn2 + m.begin * a_.dim;
  ea.idx = s.idx;
  ea.w = s.rw;
  ea.w1 = P + w.ew1;
  ea.w3 = P + w.ew3;
  ea.w2 = P + w.ew2;
  if (bf16_) {
    ea.w1_bf16 = weight_bf16(w.ew1);
    ea.w3_bf16 = weight_bf16(w.ew3);
    ea.w2_bf16 = weight_bf16(w.ew2);
  }
  ea.saved = s.experts;
  ea.scratch = experts_scratch_;
  return ea;
}

// y = Σ_j w[t,j]·expert_{idx[t,j]}(xn2[t]) with (idx, w) from the router on xn2.
void Qwen3Model::moe_forward(int64_t l, const Rows& m, float* y, bool count) {
  const Layer& w = layers_[l];
  Saved& s = saved_[l];
  const int64_t D = a_.dim, E = a_.num_experts, K = a_.top_k, T = m.n;
  be_.linear_fwd(s.xn2 + m.begin * D, store_->weights() + w.gate, dlogits_, T, D, E);  // logits
  const float* bias = a_.load_balance_coeff > 0
                          ? (dev_ ? expert_bias_dev_ : expert_bias_).data() + w.moe * E
                          : nullptr;
  be_.router_fwd(dlogits_, bias, T, E, K, a_.norm_topk_prob, s.probs, s.idx, s.rw);
  if (count) be_.count_experts(s.idx, T, K, E, counts(w.moe));
  const ops::GroupedExpertsOp& op = experts_ops_[l];
  const ops::ExpertsArgs ea = experts_args(l, m);
  guarded("Experts", op.name, true, l, [&] { op.forward(ea, y); });
}

// Backward of moe_forward: dxn (written) from dy; gate and expert gradients accumulate.
void Qwen3Model::moe_backward(int64_t l, const Rows& m, const float* dy, float* dxn) {
  const Layer& w = layers_[l];
  const Saved& s = saved_[l];
  const int64_t D = a_.dim, E = a_.num_experts, K = a_.top_k, T = m.n;
  const ops::GroupedExpertsOp& op = experts_ops_[l];
  const ops::ExpertsArgs ea = experts_args(l, m);
  ops::ExpertsGrads eg;
  eg.dy = dy;
  eg.dx = dxn;
  eg.dw = dw_route_;
  eg.dw1 = grad_at(w.ew1);
  eg.dw3 = grad_at(w.ew3);
  eg.dw2 = grad_at(w.ew2);
  guarded("Experts", op.name, false, l, [&] { op.backward(ea, eg); });
  // Tensor parallelism: the experts' hidden units are split, so their outputs' and dxn's parts
  // are partial sums and so is the routing weights' gradient: summed here, the router's backward
  // is whole (and the same) on every rank; its input gradient joins dxn's partial sum on rank 0
  // alone, so the group's reduction of dxn counts it once. A local layer (moe_local) has whole
  // experts and its own rows: everything is whole but the gate's weight gradient, which sums
  // this rank's rows and is summed over the group.
  const bool local = moe_local();
  if (tp_.active() && !local) tp_hooks_->all_reduce(dw_route_, T * K);
  const float* dp = !a_.router_aux_loss ? nullptr : dev_ ? aux_dp_dev_.data() : aux_dp_.data();
  be_.router_bwd(s.probs, s.idx, s.rw, dw_route_, dp, T, E, K, a_.norm_topk_prob, dlogits_);
  float* dgate = grad_at(w.gate);
  if (local && dgate) {
    tp_ggate_.assign(static_cast<size_t>(E * D), 0.0f);
    dgate = tp_ggate_.data();
  }
  be_.linear_bwd(dlogits_, s.xn2 + m.begin * D, store_->weights() + w.gate,
                 tp_.counts_replicated_terms() || local ? dxn : nullptr, dgate, T, D, E,
                 /*dx_accumulate=*/true);
  if (local && dgate) {
    tp_hooks_->all_reduce(dgate, E * D);
    be_.add_inplace(grad_at(w.gate), dgate, E * D);
  }
}

// HF load_balancing_loss_func over all MoE layers' router probabilities P (pooled, N = layers·T
// rows, no padding mask): aux = E·Σ_e f_e·pbar_e with f_e = (top-k hits of e)/N and
// pbar_e = Σ P[:,e]/N. Its gradient w.r.t. every P[n,e] is E·f_e/N (top-k is not
// differentiated), kept in aux_dp_ scaled by coef·aux_weight for the backward.
void Qwen3Model::aux_accumulate(int64_t l, int64_t T) {
  const int64_t E = a_.num_experts, K = a_.top_k;
  const Saved& s = saved_[l];
  const int32_t* idx = s.idx;
  if (a_.load_balance_coeff > 0) {  // the routing used a bias; HF's statistic has none
    be_.topk_rows(s.probs, T, E, K, aux_idx_);
    idx = aux_idx_;
  }
  if (dev_)
    be_.router_aux_stats(s.probs, idx, T, E, K, stats_dev_.data(), stats_dev_.data() + E);
  else
    be_.router_aux_stats(s.probs, idx, T, E, K, aux_hits_.data(), aux_psum_.data());
}

void Qwen3Model::aux_finish(int64_t T, bool backward, float aux_weight) {
  const int64_t E = a_.num_experts;
  if (dev_) {
    be_.copy(aux_hits_.data(), stats_dev_.data(), sizeof(double) * static_cast<size_t>(E));
    be_.copy(aux_psum_.data(), stats_dev_.data() + E, sizeof(double) * static_cast<size_t>(E));
  }
  if (moe_local()) {  // each rank's statistics are of its rows: summed over the group
    tp_hooks_->all_reduce_f64(aux_hits_.data(), E);
    tp_hooks_->all_reduce_f64(aux_psum_.data(), E);
  }
  if (cp_.active()) {  // the same over the sequence's chunks
    cp_.hooks()->all_reduce_f64(aux_hits_.data(), E);
    cp_.hooks()->all_reduce_f64(aux_psum_.data(), E);
  }
  const std::vector<double>& hits = aux_hits_;
  const std::vector<double>& psum = aux_psum_;
  const double N = static_cast<double>(load_.size()) * static_cast<double>(T) *
                   static_cast<double>(cp_.slice().size);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += (hits[static_cast<size_t>(e)] / N) * (psum[static_cast<size_t>(e)] / N);
  aux_loss_ = static_cast<double>(E) * aux;
  const double g = backward ? a_.router_aux_loss_coef * aux_weight : 0.0;
  for (int64_t e = 0; e < E; ++e)
    aux_dp_[static_cast<size_t>(e)] =
        static_cast<float>(g * static_cast<double>(E) * hits[static_cast<size_t>(e)] / (N * N));
  if (dev_) be_.copy(aux_dp_dev_.data(), aux_dp_.data(), sizeof(float) * static_cast<size_t>(E));
}

void Qwen3Model::finish_step() {
  const int64_t E = a_.num_experts;
  for (size_t m = 0; m < load_.size(); ++m) {
    std::vector<double>& c = load_[m];
    if (a_.load_balance_coeff > 0)  // the counts and biases are the host's (sent each pass)
      (dev_ ? &ops::expert_bias_update : be_.expert_bias_update)(
          c.data(), E, a_.load_balance_coeff, expert_bias_.data() + static_cast<int64_t>(m) * E);
    std::fill(c.begin(), c.end(), 0.0);
  }
}

std::vector<models::ExpertLoad> Qwen3Model::expert_load() const {
  std::vector<models::ExpertLoad> out;
  for (int64_t l = 0; l < a_.n_layers; ++l)
    if (layers_[l].moe >= 0)  // the counts are a statistic the trainer may reduce in place
      out.push_back(
          {l, const_cast<std::vector<double>*>(&load_[static_cast<size_t>(layers_[l].moe)])});
  return out;
}

std::vector<BufferInfo> Qwen3Model::buffers() const {
  std::vector<BufferInfo> out;
  for (int64_t l = 0; l < a_.n_layers; ++l)
    if (layers_[l].moe >= 0)
      out.push_back({"layers." + std::to_string(l) + ".moe.expert_bias",
                     {a_.num_experts},
                     const_cast<float*>(expert_bias_.data()) + layers_[l].moe * a_.num_experts});
  return out;
}

models::ModelDims Qwen3Model::dims() const {
  models::ModelDims d{a_.n_layers, a_.dim, a_.head_dim, a_.n_heads, 0, 0, {}, a_.n_kv_heads};
  for (int64_t l = 0; l < a_.n_layers; ++l) d.moe_layer.push_back(a_.moe_layer(l));
  if (a_.n_moe_layers() > 0) d.experts = a_.num_experts, d.top_k = a_.top_k;
  return d;
}

int64_t Qwen3Model::num_flop_params() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    if (p.alias) continue;
    if (p.fqn == "tok_embeddings.weight" && !a_.tie_embeddings) continue;
    int64_t whole = 1;  // the whole tensor's (a tensor-parallel slice counts the model's)
    for (int64_t x : p.shape) whole *= x;
    if (p.fqn.find(".moe.experts.") != std::string::npos)
      n += whole / a_.num_experts * a_.top_k;  // active experts only
    else
      n += whole;
  }
  return n;
}

// torchtitan's 6·N + 12·L·H·head_dim·S with the causal attention at half its square.
double Qwen3Model::flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(num_flop_params()) +
         models::attention_flops_per_token(dims(), seq_len, /*causal=*/true);
}

Qwen3Model::~Qwen3Model() = default;

models::StateDictAdapter& Qwen3Model::hf() { return *hf_; }
const models::StateDictAdapter& Qwen3Model::hf() const { return *hf_; }

}  // namespace titan::qwen3
