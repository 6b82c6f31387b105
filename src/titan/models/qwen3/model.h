// The Qwen3 model (HF Qwen3ForCausalLM / Qwen3MoeForCausalLM math, torchtitan FQNs) on the CPU
// in fp32.
//
// MoE layers (args.moe_layer(i)) replace the feed-forward by a router (gate linear [E,D], fp32
// softmax, top-k, optional renormalization; ops/router.h) and the grouped experts
// (ops/experts_op.h, a registered op pair chosen per layer). Load balancing: Transformers'
// auxiliary loss (args.router_aux_loss) and torchtitan's aux-loss-free expert bias
// (args.load_balance_coeff, applied by finish_step()).
//
// Parameters and gradients live in one flat buffer each, laid out block by block: group 0 is
// tok_embeddings, groups 1..L the decoder layers, group L+1 the final norm and an untied lm_head.
// Inside a layer, wq|wk|wv and w1|w3 are adjacent so each pair runs as one GEMM. Sharding a block
// or keeping a bf16 copy is a matter of the offsets in params().
//
// Kernels are called through the backend table of ("cpu", compute dtype) (ops/backend.h); the
// RoPE and grouped-experts kernels are the registered ops chosen per layer.
//
// Precision. compute = F32: everything fp32. compute = BF16 (torchtitan's
// mixed_precision_param = "bfloat16"): the master weights, gradients and every activation stay
// fp32; a bf16 copy of the weights (all but an untied token embedding, which is only looked up)
// is made before the first forward after the weights change (param_data() for writing,
// init_weights, load_hf); every GEMM of the attention and feed-forward projections, the experts
// and the lm_head rounds its activation operand to bf16 and multiplies with that copy, with fp32
// accumulation (torch.autocast's bf16 Linear). RMSNorm, RoPE, attention (fp32 tiles), the router
// (its gate GEMM included, as torchtitan runs it under fp32 autocast), softmax and the loss stay
// fp32.
//
// Activations for one microbatch of up to max_batch × max_seq tokens are allocated at
// construction; forward_backward() allocates nothing.
//
// Device. Built for a device other than the CPU (its backend: ops/backend.h), the weights, their
// compute copy, the gradients, the activations and the workspaces are device memory (the
// backend's alloc), and so are the batch's token ids, labels and positions (copied there by each
// pass) and the MoE layers' statistics (expert counts, auxiliary-loss sums, fetched once per
// pass). The host keeps a copy of the weights (param_data(), models/model.h), the expert biases
// (buffers(), sent before each pass) and the expert counts. The LinearHooks (LoRA) get device
// pointers; generation keeps its key/value cache in device memory. Built sharded (FSDP), the
// flat weight, gradient and compute-copy buffers are reserved ranges the hooks hold unit by unit
// (models::BuildOptions::sharded).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/models/context_parallel.h"
#include "titan/models/model.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/redistribute.h"
#include "titan/ops/backend.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/loss.h"
#include "titan/ops/rope_op.h"

namespace titan::qwen3 {

using models::Batch;
using models::BufferInfo;
using models::ParamInfo;

class Qwen3StateDictAdapter;

// What to build besides the architecture.
struct Qwen3Options {
  int64_t max_batch = 1, max_seq = 1;  // microbatch capacity (rows × tokens per row)
  // Positions the RoPE table covers (0: max_seq); more under context parallelism, whose rows are
  // chunks of longer sequences (models/context_parallel.h).
  int64_t max_positions = 0;
  int64_t loss_chunks = 8;             // the lm_head + loss runs in this many row chunks
  // The RoPE kernel pair of each layer (from the module tree and its overrides); empty: the
  // built-in cos/sin RoPE everywhere.
  std::vector<ops::RopeOp> rope_ops{};
  // The grouped-experts kernel pair of each layer (entries of dense layers are unused); empty:
  // the built-in grouped_experts op (of the compute dtype) in every MoE layer.
  std::vector<ops::GroupedExpertsOp> experts_ops{};
  // false: a plan-only model, params() and activation_table() without storage (nothing else may
  // be called on it).
  bool allocate = true;
  models::AcPolicy ac{};
  DType compute = DType::F32;
  bool trainable = true;  // false: frozen (no gradients), the base of LoRA adapters
  models::TpSlice tp{};   // the slice of the parallel layout (parallelize.h); whole by default
  std::string device = "cpu";
  bool sharded = false;  // models::BuildOptions::sharded
  // training.dtype bfloat16: the projections' masters are their bf16 compute copy
  // (models/param_store.h Options::bf16_masters); needs compute BF16 and trainable.
  bool bf16_masters = false;
};

class Qwen3Model final : public models::Model,
                         public models::Generator,
                         public models::RoutingStats {
 public:
  Qwen3Model(const Qwen3Args& args, Qwen3Options opt);
  // The defaults for a microbatch of max_batch × max_seq.
  Qwen3Model(const Qwen3Args& args, int64_t max_batch, int64_t max_seq)
      : Qwen3Model(args, Qwen3Options{.max_batch = max_batch, .max_seq = max_seq}) {}

  ~Qwen3Model() override;

  const Qwen3Args& args() const { return a_; }
  const std::vector<ParamInfo>& params() const override { return params_; }
  models::ParamStore& store() override { return *store_; }
  const models::ParamStore& store() const override { return *store_; }
  std::string device() const override { return be_.device; }
  void set_linear_hooks(models::LinearHooks* h) override { lin_hooks_ = h; }
  // Tensor parallelism (models/tensor_parallel.h): built for one slice, the parameters are this
  // rank's slices (params()' split_dim), activations hold this rank's heads and hidden units and,
  // with sequence parallelism, the residual stream this rank's tokens; the hooks carry the
  // collectives. Training and evaluation losses only: logits, generation and the Hugging Face
  // adapter need the whole model (the trainer gathers one, train/tensor_parallel.h).
  models::TpSlice tp_slice() const override { return tp_; }
  // parallelize.h: the group's collectives and the redistributions over them.
  void set_tp_group(models::TpHooks* h, const models::TpRegion& region);
  // Context parallelism (models/context_parallel.h): the microbatch rows are this rank's chunks
  // of the sequence; attention sees the whole sequence through the group's collectives, and the
  // MoE auxiliary loss's statistics are summed over it.
  void set_cp_group(const models::ContextAttention& cp) { cp_ = cp; }
  int64_t vocab_size() const override { return a_.vocab_size; }

  // torchtitan/HF init: Linear and untied embedding weights ~ N(0, 0.02), norms 1. Each tensor
  // draws from its own counter-based stream, so the result is independent of threads.
  void init_weights(uint64_t seed, float std = 0.02f, int64_t unit = -1) override;
  void zero_grad() override { store_->zero_grads(); }

  // Forward and backward of one microbatch; gradients accumulate (+=) scaled by grad_scale
  // (1 / valid tokens of the whole step). Returns Σ CE over valid labels and their count.
  // With the auxiliary loss on, the microbatch's loss also has router_aux_loss_coef ·
  // aux_weight · aux (aux_weight = 1 / microbatches per step makes the step's term the mean).
  ops::LossSum forward_backward(const Batch& b, float grad_scale, float aux_weight = 1.0f) override;
  // Forward only (evaluation): Σ CE and the count.
  ops::LossSum forward_loss(const Batch& b) override;
  // Forward only: all logits, out[B·S, V] (labels may be null). For evaluation and parity checks;
  // training never forms all logits.
  void forward_logits(const Batch& b, float* out) override;

  // ---- generation (models::KvCache): keys and values after k_norm and RoPE, fp32, per layer
  // [n_seq, max_len, kv_dim] (in the model's memory); max_len at most the model's seq_len (its
  // RoPE table). Each call of
  // forward_cached runs its tokens as one microbatch row (at most batch·seq_len tokens) through
  // the training forward's kernels, with attention_cached in place of attention_fwd (fp32 also
  // under bf16 mixed precision, where the GEMMs run on the bf16 weight copy as in training).
  models::Generator* generator() override { return this; }
  std::unique_ptr<models::KvCache> new_kv_cache(int64_t n_seq, int64_t max_len) override;
  int64_t forward_cached(models::KvCache& cache, const int32_t* tokens, const int32_t* seq,
                         int64_t n, float* logits) override;
  int64_t max_new_per_call() const override { return max_tokens_; }

  // ---- MoE state (models::RoutingStats; a dense model's are empty)
  const models::RoutingStats* routing() const override { return this; }
  // The auxiliary load-balancing loss of the last forward (HF load_balancing_loss_func over all
  // MoE layers' router probabilities, pooled; no coefficient); 0 for a dense model.
  double last_aux_loss() const override { return aux_loss_; }
  std::optional<double> aux_loss_coef() const override {
    return a_.router_aux_loss ? std::optional<double>(a_.router_aux_loss_coef) : std::nullopt;
  }
  // Tokens routed to each expert since the last finish_step(), per MoE layer: [n_moe][E].
  // Counted in training forwards only (torchtitan's tokens_per_expert).
  std::vector<models::ExpertLoad> expert_load() const override;
  // End of an optimizer step (before the update, as torchtitan's pre-step hook): with
  // load_balance_coeff > 0, expert_bias += coeff·sign(mean(load) − load) centred to mean 0, per
  // layer; then the counts restart.
  void finish_step() override;
  // The persistent buffers (expert_bias per MoE layer); writable through data.
  std::vector<BufferInfo> buffers() const override;

  models::ModelDims dims() const override;
  // torchtitan: 6·N (embedding excluded unless tied) + 6·L·H·2·head_dim·seq_len.
  double flops_per_token(int64_t seq_len) const override;
  // Parameters counted in the FLOPs formula (N above): for MoE, experts count K/E of theirs
  // (active parameters).
  int64_t num_flop_params() const override;
  const std::vector<models::TensorSize>& activation_table() const override { return sizes_; }

  // ---- Hugging Face adapter (state_dict_adapter.h, hf_config.h)
  models::StateDictAdapter& hf() override;
  const models::StateDictAdapter& hf() const override;

 private:
  struct Layer {
    int64_t attention_norm, wqkv, q_norm, k_norm, wo, ffn_norm;  // parameter offsets
    int64_t w13 = 0, w2 = 0;                                     // dense feed-forward
    int64_t moe = -1;                             // index among MoE layers, -1 for a dense layer
    int64_t gate = 0, ew1 = 0, ew3 = 0, ew2 = 0;  // router and experts
  };
  struct Saved {  // activations of one layer kept for the backward
    float *x, *xn1, *rstd1, *qkv, *qr, *kr, *rstd_q, *rstd_k, *o, *lse, *hmid, *xn2, *rstd2, *ab,
        *g;
    float *probs = nullptr, *rw = nullptr, *experts = nullptr;  // MoE: router p, weights, op state
    int32_t* idx = nullptr;
  };
  // Expert parallelism over the tp ranks (tp_.active() and tp_.ep_active(), torchtitan's EP
  // borrowing TP ranks with expert_tensor_parallel_degree 1): a MoE layer routes only this rank's
  // token rows and the dispatch sends them to the experts' ranks (ReordererSequenceParallel's
  // split): under SP its own sequence shard, so the FFN input is not gathered nor its output
  // reduce-scattered; without SP rows [r·T/P, (r+1)·T/P) of the replicated input, the output's
  // other rows zero and all-reduced like any row-parallel output. The router's weight gradient,
  // the aux-loss statistics and (in the trainer) the expert counts are then partial over the tp
  // ranks and summed.
  bool moe_local() const { return tp_.active() && tp_.ep_active(); }
  struct Rows {
    int64_t begin = 0, n = 0;  // rows of xn2 (its local rows under SP)
  };
  Rows moe_rows(int64_t T) const;  // the rows a MoE layer routes on this rank
  // The FFN input norm: local rows for a local MoE layer under SP, else norm_gathered.
  void ffn_norm(int64_t l, int64_t Tl, Saved& s);
  ops::ExpertsArgs experts_args(int64_t l, const Rows& m);
  // y: the output of rows m ([m.n, D]); dy, dxn likewise.
  void moe_forward(int64_t l, const Rows& m, float* y, bool count);
  void moe_backward(int64_t l, const Rows& m, const float* dy, float* dxn);
  // Transformers' auxiliary loss, pooled over the MoE layers: statistics of layer l right after
  // its router (the router's buffers may be shared under activation checkpointing), then the
  // loss and its gradient w.r.t. the probabilities.
  void aux_accumulate(int64_t l, int64_t T);
  void aux_finish(int64_t T, bool backward, float aux_weight);
  // Generation: where layer_forward appends the new tokens' keys and values and what they attend
  // to (attention_cached's arguments; per-layer cache pointers = layer base + these offsets).
  struct Cached {
    float *k, *v;            // this layer's cache, rows of kv_dim
    const int64_t* row;      // [T] the row of each new token (seq·max_len + position)
    const int64_t* seq_row;  // [T] the row of its sequence's position 0
    const int32_t* n_keys;   // [T] position + 1 (in the model's memory)
    const float **kp, **vp;  // [T] host scratch: the token's sequence's keys and values
    const float** kv_dev;    // off the CPU: [2T] kp and vp copied to device memory
  };
  void layer_forward(int64_t l, const Batch& b, float* out, bool count,
                     const Cached* cached = nullptr);
  void layer_backward(int64_t l, const Batch& b);
  void recompute_cheap(int64_t l, const Batch& b);
  ops::LossSum run(const Batch& hb, float grad_scale, float aux_weight, bool backward,
                   float* logits_out = nullptr);
  // Off the CPU: the batch's arrays copied to device memory; the expert counts of a training
  // forward added to load_.
  Batch device_batch(const Batch& b);
  void fetch_counts();
  // Where the kernels read and write the MoE statistics: device memory off the CPU.
  double* counts(int64_t moe) {
    return dev_ ? counts_dev_.data() + moe * a_.num_experts
                : load_[static_cast<size_t>(moe)].data();
  }
  // A projection y[M,out] = x·Wᵀ with the weight at parameter offset w, in the compute precision;
  // and its backward (dW at the same offset of the gradients accumulates).
  void linear(const float* x, int64_t w, float* y, int64_t M, int64_t in, int64_t out);
  void linear_back(const float* dy, const float* x, int64_t w, float* dx, int64_t M, int64_t in,
                   int64_t out);
  const uint16_t* weight_bf16(int64_t offset) const { return store_->weight_bf16(offset); }
  // A unit's use (models::ParamStore: the hooks, a stale compute copy remade).
  void acquire(int64_t u, bool backward) { store_->acquire(u, backward); }
  void release(int64_t u, bool backward) { store_->release(u, backward); }
  void grads_ready(int64_t u) { store_->grads_ready(u); }
  // The ranges of the flat parameters read only through the bf16 copy of a frozen model (the
  // projections).
  std::vector<models::FlatRange> copy_only_ranges() const;
  void call_rope(int64_t layer, bool forward, float* x, const Batch& b, int64_t heads, int64_t ld);
  // The constructor's steps: the parameter layout (this slice's, parallelize.h's plan) and the
  // store; the per-layer ops checked against the device; the buffers and the arenas carved from
  // the size table.
  void lay_out_params(bool sharded);
  void add_param(const std::string& fqn, std::vector<int64_t> shape, int64_t group, int64_t* off);
  void set_up_ops(bool allocate);
  void allocate_buffers(const std::vector<void**>& slots);
  // Tensor parallelism's redistributions (models/redistribute.h; identities when the model is
  // whole): gather_ where the residual stream's norms feed the column-parallel projections,
  // reduce_ where the row-parallel ones (wo, w2, the embedding) return partial sums; their
  // scratch is tmp_ (forward) and tp_buf_. local_tokens: the residual stream's tokens held here.
  int64_t local_tokens(int64_t T) const { return tp_.sequence_parallel ? T / tp_.size : T; }
  // A norm of the residual stream whose output the projections read whole.
  void norm_gathered(int64_t Tl, const float* x, int64_t w, float* out, float* rstd);
  // The gradients of the replicated norm weights one backward computed in tp_gnorm_ (n slots of
  // lens[i] values, the first n_residual the residual stream's norms), summed over the group where
  // they are partial, added to the gradients at offsets[i].
  void reduce_norm_grads(const int64_t* offsets, const int64_t* lens, int n, int n_residual);
  void embedding_forward(const int32_t* ids, int64_t T, float* out);
  void embedding_backward(const int32_t* ids, int64_t T);
  // Fills sizes_ (the size table) and, per entry, the member pointer it is carved into.
  void declare_tensors(std::vector<void**>* slots);

  Qwen3Args a_;
  models::TpSlice tp_;
  models::TpHooks* tp_hooks_ = nullptr;
  models::GatherSequence gather_;
  models::ReducePartial reduce_;
  models::ContextAttention cp_;
  // This slice's sizes (the whole model's without tensor parallelism): heads, projection widths,
  // feed-forward and experts' hidden units, vocabulary rows [v0_, v0_ + vl_).
  int64_t hq_ = 0, hkv_ = 0, q_ = 0, kv_ = 0, qkv_ = 0, f_ = 0, fm_ = 0, v0_ = 0, vl_ = 0;
  const ops::Backend& be_;     // the kernels (<device>/float32 or <device>/bfloat16)
  DeviceMemory mem_;           // be_'s memory: where every buffer below lives (but the host's)
  bool dev_ = false;           // off the CPU (mem_ is a device's)
  Buffer<int32_t> batch_dev_;  // dev_: [3, max_tokens] input, labels, positions
  // dev_: the expert biases' device copy [n_moe, E], the expert counts [n_moe, E], the aux
  // loss's sums [2, E] (hits, Σ p) and its gradient w.r.t. p [E]
  Buffer<float> expert_bias_dev_, aux_dp_dev_;
  Buffer<double> counts_dev_, stats_dev_;
  std::vector<double> counts_host_;  // fetch_counts' copy of counts_dev_
  bool bf16_ = false;                // mixed precision: GEMMs on the bf16 weight copy
  bool trainable_ = true;            // false: frozen, no gradients of the parameters
  bool bf16_masters_ = false;        // Qwen3Options::bf16_masters
  models::LinearHooks* lin_hooks_ = nullptr;
  // The gradient of the parameter at offset `off`, or null when frozen.
  float* grad_at(int64_t off) { return store_->grad_at(off); }
  uint16_t* lin_scratch_ = nullptr;  // bf16 GEMM operands of linear / linear_back
  int64_t max_tokens_, max_batch_, max_seq_, max_positions_, loss_chunk_rows_;
  std::vector<ParamInfo> params_;
  std::optional<models::ParamStore> store_;  // made once the layout is known
  std::unique_ptr<Qwen3StateDictAdapter> hf_;
  std::vector<Layer> layers_;
  int64_t tok_emb_ = 0, norm_ = 0, lm_head_ = 0;

  Buffer<float> rope_;                              // [max_seq, head_dim] cos|sin
  std::vector<ops::RopeOp> rope_ops_;               // per layer
  std::vector<ops::GroupedExpertsOp> experts_ops_;  // per layer (MoE layers)
  Buffer<float> expert_bias_;                       // [n_moe, E]
  std::vector<std::vector<double>> load_;           // [n_moe][E]
  double aux_loss_ = 0;
  std::vector<float> aux_dp_;                // [E] the aux loss gradient w.r.t. every p[t,e]
  std::vector<double> aux_hits_, aux_psum_;  // [E] top-k hits and Σ p per expert, all layers
  models::AcPolicy ac_;
  int32_t* aux_idx_ = nullptr;  // [T, K]
  float *dw_route_ = nullptr, *dlogits_ = nullptr, *experts_scratch_ = nullptr;
  std::vector<models::TensorSize> sizes_;  // the size table
  Arena acts_;                             // saved activations, all layers
  std::vector<Saved> saved_;               // per layer views into acts_ (or recompute_)
  Saved recompute_{};  // activation checkpointing: the recomputed tensors, in work_
  float *h_final_, *xf_, *rstd_f_;
  Arena work_;  // temporaries reused by every layer
  float *tmp_, *dx_, *dxn_, *dqkv_, *dq_, *dkr_, *do_, *dab_, *dg_, *attn_scratch_, *norm_scratch_,
      *delta_, *loss_scratch_;
  Buffer<int32_t> seg_;  // attention segment starts for the current microbatch
  // Tensor parallelism: a [T, D] workspace (reduce-scatter and all-gather ends), the replicated
  // norms' gradients of one backward.
  float* tp_buf_ = nullptr;
  Buffer<float> tp_gnorm_;
  std::vector<float> tp_ggate_;  // [E, D] moe_local(): one backward's router weight gradient
};

}  // namespace titan::qwen3
