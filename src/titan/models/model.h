// The model interface: what the trainer, the evaluator, the validator, check-kernel and the
// checkpointer see of a model (torchtitan's ModelSpec + the nn.Module surface they use). A model
// registers under its model.name (models/registry.h); Qwen3 (dense and MoE) is the first.
//
// Parameters and gradients live in one flat fp32 buffer each; params() lists every tensor with
// its FQN, global shape, the slice of it this process holds and its offset in the buffer.
// Without sharding the local slice is the whole tensor.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/core/dtype.h"
#include "titan/core/tensor_source.h"
#include "titan/models/param_store.h"
#include "titan/models/tensor_parallel.h"
#include "titan/ops/loss.h"

namespace titan::models {

struct ParamInfo {
  std::string fqn;
  std::vector<int64_t> shape;  // global shape
  int64_t offset = 0;          // into the flat parameter buffer
  int64_t numel = 0;           // elements held here (the slice's, under tensor parallelism)
  int64_t group = 0;           // 0 embeddings, 1..L layers, L+1 head
  bool alias = false;          // lm_head.weight when tied: same storage as tok_embeddings.weight
  // The slice held here (a model built for a tensor-parallel slice, models/tensor_parallel.h):
  // indices [local_begin, local_begin + local_len) of dimension split_dim, all of the others;
  // split_dim -1: the whole tensor.
  int split_dim = -1;
  int64_t local_begin = 0, local_len = 0;
  bool split_over_ep = false;  // the slice is of the ep ranks (the experts), not the tp ranks
  // The module's tensor/expert-parallel placement (torchtitan's sharding plan, as data; the
  // model runs unsharded): replicated; column-wise (dim 0 split over the tp ranks: wq, wk, wv,
  // w1, w3, the vocab of the embedding and lm_head); row-wise (dim 1: wo, w2); experts (dim 0,
  // the experts, over the ep ranks; without EP their hidden dimension over tp).
  enum class Tp { replicate, colwise, rowwise, experts };
  Tp tp = Tp::replicate;
};

// A persistent non-parameter tensor (torchtitan's expert_bias): checkpointed, not trained by the
// optimizer, not exported to Hugging Face.
struct BufferInfo {
  std::string fqn;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

// One microbatch: B rows of S tokens. positions restart at 0 at each document.
struct Batch {
  int64_t B = 0, S = 0;
  const int32_t* input = nullptr;
  const int32_t* labels = nullptr;  // -100 = ignore
  const int32_t* positions = nullptr;
};

// One Hugging Face tensor and where it lives in the flat parameter buffer (contiguous).
struct HfTensor {
  std::string key;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  std::string fqn;  // the titan parameter it is (part of)
};

// Activation checkpointing (torchtitan's activation_checkpoint.mode / selective_ac_option):
// full recomputes a block's forward in its backward from the block's input, for every block or
// (selective N) every N-th ((i+1) % N == 0); op keeps each block's GEMM and attention outputs and
// recomputes its norms, RoPE and SwiGLU. Same kernels on the same inputs: results are bitwise
// those without it.
struct AcPolicy {
  enum class Mode { none, full, op } mode = Mode::none;
  int64_t every = 1;
  // From the config's strings (validated by config::validate).
  static AcPolicy from_config(const std::string& mode, const std::string& selective_option);
  bool full_block(int64_t i) const { return mode == Mode::full && (i + 1) % every == 0; }
  std::string describe() const;
};

// Tokens routed to each expert of one MoE layer since the last finish_step().
struct ExpertLoad {
  int64_t layer = 0;
  // [experts]; the trainer sums them over data-parallel ranks in place before finish_step()
  std::vector<double>* tokens = nullptr;
};

// One entry of a model's size table (llm.c's activation table): an activation saved for the
// backward (per layer, or layer -1 for the head) or a workspace shared by the layers, for the
// largest microbatch. Allocation, carving and the memory plan read the same table; activation
// checkpointing will decide from it what to keep.
struct TensorSize {
  std::string name;
  int64_t layer = -1;
  bool saved = true;  // false: a workspace
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  // How it divides over the tp ranks of a tensor-parallel layout: not (the gathered inputs of
  // the projections, the router's tensors); over the tokens with sequence parallelism (the
  // residual stream, the norms' statistics); over heads or hidden units (projections' outputs,
  // attention; the logits chunk with loss parallelism).
  enum class Tp { full, sequence, feature };
  Tp tp = Tp::full;
  // What the memory plan must know of a few tensors, whatever the model calls them: a MoE
  // layer's routing weights [T, K] (expert parallelism's dispatch sends and keeps T·K rows of
  // the hidden size, saved or, under activation checkpointing, recomputed), and the loss's
  // workspace (the bf16 converting path copies it).
  enum class Role { none, routing_weights, loss_scratch };
  Role role = Role::none;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  // Bytes as an arena takes them: rounded up to 64 (core/buffer.h).
  int64_t aligned_bytes() const {
    return (numel() * static_cast<int64_t>(dtype_size(dtype)) + 63) / 64 * 64;
  }
};

// Where the elements [a, z) of parameter p's data held here (its slice under tensor/expert
// parallelism, laid out row-major with dimension split_dim cut to local_len) sit in the whole
// tensor, flattened: fn(whole_begin, local_begin, len) for each contiguous run, in order. A whole
// parameter (split_dim −1) is one run at the same place.
template <typename Fn>
void for_each_whole_run(const ParamInfo& p, int64_t a, int64_t z, Fn&& fn) {
  if (p.split_dim < 0) {
    if (a < z) fn(a, a, z - a);
    return;
  }
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(p.split_dim) + 1; i < p.shape.size(); ++i)
    inner *= p.shape[i];
  const int64_t run = p.local_len * inner;  // one outer index's elements here
  const int64_t stride = p.shape[static_cast<size_t>(p.split_dim)] * inner;
  while (a < z) {
    const int64_t o = a / run, r = a % run, n = std::min(z - a, run - r);
    fn(o * stride + p.local_begin * inner + r, a, n);
    a += n;
  }
}

// Extra terms of the model's linear layers (low-rank adapters, models/lora.h). After each
// projection y[M,out] = x[M,in]·Wᵀ whose weight block [out, in] starts at offset w of the flat
// parameter buffer (one GEMM may cover adjacent parameters: wq|wk|wv, w1|w3), the model calls
// forward(); in the backward, after computing dx of that projection, backward(). Projections
// of the router and the lm_head are not hooked.
class LinearHooks {
 public:
  virtual ~LinearHooks() = default;
  // y[M,out] += the block's extra term for x[M,in].
  virtual void forward(int64_t w, const float* x, float* y, int64_t M, int64_t in, int64_t out) = 0;
  // Backward of forward() for dy[M,out]: dx[M,in] += its input gradient; the hooks' own
  // parameter gradients accumulate.
  virtual void backward(int64_t w, const float* dy, const float* x, float* dx, int64_t M,
                        int64_t in, int64_t out) = 0;
};

// Generation (titan generate): the keys and values of every layer for a set of sequences, so
// that each new token runs through the model once. Made by Generator::new_kv_cache.
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int64_t sequences() const = 0;
  virtual int64_t capacity() const = 0;           // tokens per sequence (prompt + generated)
  virtual int64_t length(int64_t seq) const = 0;  // tokens cached
  virtual void clear(int64_t seq) = 0;            // the sequence starts again, empty
};

// Generation: a model's forward over a key/value cache (Model::generator()).
class Generator {
 public:
  virtual ~Generator() = default;
  // A cache for n_seq sequences of up to max_len tokens each; throws titan::Error when the model
  // cannot serve it (max_len beyond the model's positions).
  virtual std::unique_ptr<KvCache> new_kv_cache(int64_t n_seq, int64_t max_len) = 0;
  // Runs n new tokens through the model: tokens[i] is appended to sequence seq[i] at the next
  // position (a sequence's tokens in order), attending to everything cached for it before and to
  // its own earlier new tokens. logits[r, V] ← the logits of the last new token of each sequence
  // of the call, in the order the sequences first appear; returns that number of rows. n is at
  // most max_new_per_call(). Same kernels and precision as forward_logits: the logits of a prompt
  // fed at once equal forward_logits' last rows up to the attention's summation order.
  virtual int64_t forward_cached(KvCache& cache, const int32_t* tokens, const int32_t* seq,
                                 int64_t n, float* logits) = 0;
  virtual int64_t max_new_per_call() const = 0;
};

// What a model with routed experts reports of its routing (Model::routing()).
class RoutingStats {
 public:
  virtual ~RoutingStats() = default;
  // The auxiliary loss coefficient when the model has one switched on, and its last value.
  virtual std::optional<double> aux_loss_coef() const = 0;
  virtual double last_aux_loss() const = 0;
  virtual std::vector<ExpertLoad> expert_load() const = 0;
};

// The Hugging Face form of a model's parameters (torchtitan's StateDictAdapter; Model::hf()).
class StateDictAdapter {
 public:
  virtual ~StateDictAdapter() = default;
  // Every HF tensor of the model (a tied lm_head omitted); for adapters, PEFT's keys.
  virtual std::vector<HfTensor> hf_tensors() const = 0;
  // Copies every parameter from an HF state dict; missing, unexpected and mis-shaped keys are
  // reported at once in one titan::Error naming `where`. With `only`, just those ranges of the
  // flat parameter buffer are read (a sharded trainer's slices; the rest stays as it was).
  virtual void load_hf(const TensorSource& src, const std::string& where,
                       const std::vector<FlatRange>* only = nullptr) = 0;
  // The names of an HF export's weights and config: model.safetensors and config.json, or for
  // adapters PEFT's adapter_model.safetensors and adapter_config.json.
  virtual std::string hf_weights_file() const { return "model.safetensors"; }
  virtual std::string hf_config_file() const { return "config.json"; }
  // config.json (adapter_config.json) for this model, starting from `base` (the source model's, or
  // empty) so that fields titan does not model are kept; dtype is the export dtype's torch name.
  virtual nlohmann::json hf_config(const nlohmann::json& base, const std::string& dtype) const = 0;
};

// A model's block dimensions, from its arguments (never parsed from parameter names), for the
// reports and volume formulas that need them (tensor parallelism's bytes, the memory plan).
struct ModelDims {
  int64_t layers = 0, dim = 0, head_dim = 0, heads = 0;
  int64_t experts = 0, top_k = 0;  // routed experts per MoE layer and per token (0: dense)
  std::vector<bool> moe_layer;     // [layers]
  int64_t kv_heads = 0;            // key/value heads (GQA)
};

// Attention's FLOPs per token of a training step (forward and backward: 3 × the forward's
// Q·Kᵀ and P·V, 2·heads·head_dim·seq_len each) over `layers` layers: torchtitan's count, the whole
// S × S square, with causal false; half of it with causal true, the work a causal kernel does.
double attention_flops_per_token(const ModelDims& d, int64_t seq_len, bool causal);

// The FSDP units (models/param_store.h) of a parameter list, from its groups.
std::vector<ParamUnit> param_units(const std::vector<ParamInfo>& params);

// A model's compute and what it declares (its parameters, activations and FLOPs); storage,
// generation, routing statistics and the Hugging Face form are its parts above.
class Model {
 public:
  virtual ~Model() = default;

  // ---- parameters and buffers
  virtual const std::vector<ParamInfo>& params() const = 0;
  // Where the parameters are stored (models/param_store.h): the fp32 masters (host copy off the
  // CPU), the gradients in the model's memory, the compute copy, the FSDP units' hold and give
  // back.
  virtual ParamStore& store() = 0;
  virtual const ParamStore& store() const = 0;
  int64_t num_params() const { return store().size(); }  // unique parameters (the flat buffers)
  // The persistent buffers, writable through data.
  virtual std::vector<BufferInfo> buffers() const = 0;
  const ParamInfo& param(const std::string& fqn) const;  // throws titan::Error when absent
  float* param_ptr(const std::string& fqn) { return store().param_data() + param(fqn).offset; }
  float* grad_ptr(const std::string& fqn) { return store().grads() + param(fqn).offset; }
  virtual int64_t vocab_size() const = 0;
  virtual std::string device() const { return "cpu"; }
  // Seeded init (torchtitan/HF: Linear and embeddings N(0, std), norms 1), independent of
  // threads; unit >= 0: only that unit's tensors (the same values as a whole init gives them).
  virtual void init_weights(uint64_t seed, float std = 0.02f, int64_t unit = -1) = 0;
  virtual void zero_grad() = 0;

  // ---- tensor parallelism: the model's slice, set at construction (models/tensor_parallel.h;
  // its spec's parallelize installs the group's collectives); hooks: the linear layers' extra
  // terms (none by default)
  virtual TpSlice tp_slice() const { return {}; }
  virtual void set_linear_hooks(LinearHooks* /*h*/) {}

  // ---- adapters (models/lora.h): the frozen model they adapt (null for an ordinary model);
  // fold them into its weights (merge) or give it back its own weights
  virtual Model* frozen_base() { return nullptr; }
  const Model* frozen_base() const { return const_cast<Model*>(this)->frozen_base(); }
  virtual void merge_adapters(bool /*merge*/) {}
  // false: the model computes its frozen base alone, without the adapters (DPO's reference
  // model), until set true again; nothing for a model without adapters.
  virtual void set_adapters_enabled(bool /*on*/) {}

  // ---- compute
  // Forward and backward of one microbatch; gradients accumulate (+=) scaled by grad_scale
  // (1 / valid tokens of the whole step). Returns Σ CE over valid labels and their count. An
  // auxiliary loss (routing()->aux_loss_coef()) adds coef · aux_weight · aux to the microbatch's
  // loss.
  virtual ops::LossSum forward_backward(const Batch& b, float grad_scale,
                                        float aux_weight = 1.0f) = 0;
  virtual ops::LossSum forward_loss(const Batch& b) = 0;
  // All logits, out[B·S, V]; for evaluation and parity checks.
  virtual void forward_logits(const Batch& b, float* out) = 0;
  // End of an optimizer step, before the update (torchtitan's optimizer pre-step hooks).
  virtual void finish_step() {}

  // ---- what it declares: its dimensions, FLOPs for MFU (torchtitan's formula with causal
  // attention counted at the half of its square that it computes: attention_flops_per_token),
  // the size table
  virtual ModelDims dims() const = 0;
  virtual double flops_per_token(int64_t seq_len) const = 0;
  virtual int64_t num_flop_params() const = 0;
  virtual const std::vector<TensorSize>& activation_table() const = 0;

  // ---- its parts: generation (null when it has none; generation() throws titan::Error then),
  // routing statistics (null without routed experts), the Hugging Face form
  virtual Generator* generator() { return nullptr; }
  Generator& generation();
  virtual const RoutingStats* routing() const { return nullptr; }
  virtual StateDictAdapter& hf() = 0;
  virtual const StateDictAdapter& hf() const = 0;
};

// The frozen weights a model holds (its frozen base's, models/lora.h) and the bytes they occupy;
// 0 for an ordinary model.
// A scan of a model's weights (the fp32 values; bf16 masters must be widened first) for NaN and
// infinity: "" when every weight is finite, else e.g. "3 non-finite value(s) (the first in
// 'norm.weight')".
std::string describe_nonfinite_weights(const Model& m);

inline int64_t frozen_weights(const Model& m) {
  return m.frozen_base() ? m.frozen_base()->num_params() : 0;
}
inline int64_t frozen_bytes(const Model& m) {
  return m.frozen_base() ? m.frozen_base()->store().master_bytes() : 0;
}
// Bytes of the bf16 compute copy a model computes with: its own, or (adapters) its frozen base's.
inline int64_t compute_copy_bytes(const Model& m) {
  return (m.frozen_base() ? m.frozen_base()->store() : m.store()).compute_copy_bytes();
}

}  // namespace titan::models
