// LoRA adapters (PEFT's LoraModel, peft.tuners.lora) on a frozen model, seen by the trainer, the
// evaluator, generation and the checkpointer as a model whose parameters are the adapters alone.
//
// For each adapted projection y = x·Wᵀ (W [out, in], a 2-D ".weight" of a decoder layer whose
// module leaf is a target: wq wk wv wo w1 w2 w3, or the Hugging Face names q_proj k_proj v_proj
// o_proj gate_proj up_proj down_proj), with rank r:
//   forward:  y += s · (drop(x)·Aᵀ)·Bᵀ          A [r, in], B [out, r], s = alpha / r
//             (alpha / sqrt(r) with use_rslora); drop = inverted dropout with probability p
//             while training (each adapter its own mask, as each PEFT module has its own
//             nn.Dropout), the identity otherwise;
//   backward: u = s·drop(x)·Aᵀ [M, r] recomputed, dB += dyᵀ·u, du = s·dy·B, dA += duᵀ·drop(x),
//             dx += drop'(du·A): the backward of forward for the same x and dropout mask.
// The masks are counter-based (seed, forward_backward call, adapter, element), so a block
// recomputed under activation checkpointing draws the same ones.
// Init as PEFT's: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0 (the
// adapted model starts equal to the base). Adapters compute in fp32 (also under bf16 mixed
// precision, where the base's GEMMs run in bf16), with fp32 weights, gradients and AdamW state.
//
// The base model is frozen (built with BuildOptions::trainable off: no gradient buffer, its
// backward computes only the activations' gradients). Parameters of this model:
// "layers.L.attention.wq.lora_A.weight" [r, in] and ".lora_B.weight" [out, r] for every adapted
// "layers.L.attention.wq.weight", in the base's order (group = the base layer's unit).
// Its Hugging Face form is PEFT's adapter directory: adapter_model.safetensors with keys
// "base_model.model.<HF module>.lora_A.weight" / ".lora_B.weight" and adapter_config.json.
// On a base built for a device (Model::device()), the adapters, their gradients and scratch live
// in that device's memory too and run on its fp32 kernels (param_data(): the host copy of
// models/param_store.h); the dropout masks are drawn there too (ops::dropout, the same bits).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/rng.h"
#include "titan/models/model.h"
#include "titan/ops/backend.h"

namespace titan::models {

struct LoraOptions {
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0;
  std::string target_modules = "wq,wk,wv,wo,w1,w2,w3";  // comma-separated, either naming
  bool use_rslora = false;
  uint64_t seed = 0;              // the init and the dropout masks
  std::string base_name_or_path;  // adapter_config.json's base_model_name_or_path
};

// Reads a PEFT adapter_config.json into o: r, lora_alpha, use_rslora and target_modules (a
// string or a list of strings). Each field is checked where it is read: the file must be a JSON
// object with peft_type "LORA" and no use_dora, r a positive integer, lora_alpha a positive
// number; titan::Error names the file and the field otherwise.
void read_adapter_config(const std::string& file, LoraOptions* o);

// The torchtitan leaves named by a target_modules list (Hugging Face names mapped); throws
// titan::Error naming lora.target_modules for an unknown name or an empty list.
std::vector<std::string> lora_target_leaves(const std::string& list);

class LoraModel final : public Model,
                        public LinearHooks,
                        public Generator,
                        public StateDictAdapter {
 public:
  // allocate = false: a plan-only model (params() only). Throws titan::Error when no parameter
  // of the base matches the targets.
  LoraModel(std::unique_ptr<Model> base, const LoraOptions& o, bool allocate);
  ~LoraModel() override;

  double scale() const { return scale_; }

  // ---- parameters: the adapters
  const std::vector<ParamInfo>& params() const override { return params_; }
  ParamStore& store() override { return *store_; }
  const ParamStore& store() const override { return *store_; }
  std::string device() const override { return base_->device(); }
  std::vector<BufferInfo> buffers() const override { return base_->buffers(); }
  int64_t vocab_size() const override { return base_->vocab_size(); }
  // The adapters only (the base keeps its weights); unit is ignored.
  void init_weights(uint64_t seed, float std = 0.02f, int64_t unit = -1) override;
  void zero_grad() override { store_->zero_grads(); }
  Model* frozen_base() override { return base_.get(); }
  void merge_adapters(bool merge) override;
  void set_adapters_enabled(bool on) override { base_->set_linear_hooks(on ? this : nullptr); }

  // ---- compute: the base's, with the adapters hooked into its linear layers
  ops::LossSum forward_backward(const Batch& b, float grad_scale, float aux_weight = 1.0f) override;
  ops::LossSum forward_loss(const Batch& b) override {
    store_->sync_device();
    return base_->forward_loss(b);
  }
  void forward_logits(const Batch& b, float* out) override {
    store_->sync_device();
    base_->forward_logits(b, out);
  }
  // Generation: the base's, with the adapters' weights sent to its device first.
  Generator* generator() override { return base_->generator() ? this : nullptr; }
  std::unique_ptr<KvCache> new_kv_cache(int64_t n_seq, int64_t max_len) override {
    return base_->generation().new_kv_cache(n_seq, max_len);
  }
  int64_t forward_cached(KvCache& cache, const int32_t* tokens, const int32_t* seq, int64_t n,
                         float* logits) override {
    store_->sync_device();
    return base_->generation().forward_cached(cache, tokens, seq, n, logits);
  }
  int64_t max_new_per_call() const override {
    return const_cast<Model&>(*base_).generation().max_new_per_call();
  }

  // The work done per token: the base's forward and its input gradients (4 per frozen weight,
  // no weight gradients) plus 6 per adapter parameter, and the base's attention term.
  double flops_per_token(int64_t seq_len) const override;
  int64_t num_flop_params() const override { return base_->num_flop_params(); }
  ModelDims dims() const override { return base_->dims(); }
  const std::vector<TensorSize>& activation_table() const override {
    return base_->activation_table();
  }
  void finish_step() override { base_->finish_step(); }
  const RoutingStats* routing() const override { return base_->routing(); }

  // ---- PEFT's adapter directory (this model's StateDictAdapter)
  StateDictAdapter& hf() override { return *this; }
  const StateDictAdapter& hf() const override { return *this; }
  std::vector<HfTensor> hf_tensors() const override;
  // Reads the adapters from an adapter_model.safetensors (PEFT keys); missing, unexpected and
  // mis-shaped keys in one error naming `where`.
  void load_hf(const TensorSource& src, const std::string& where,
               const std::vector<FlatRange>* only = nullptr) override;
  // adapter_config.json (base: ignored).
  nlohmann::json hf_config(const nlohmann::json& base, const std::string& dtype) const override;
  std::string hf_weights_file() const override { return "adapter_model.safetensors"; }
  std::string hf_config_file() const override { return "adapter_config.json"; }

  // ---- LinearHooks (called by the base)
  void forward(int64_t w, const float* x, float* y, int64_t M, int64_t in, int64_t out) override;
  void backward(int64_t w, const float* dy, const float* x, float* dx, int64_t M, int64_t in,
                int64_t out) override;

 private:
  struct Adapter {
    int64_t base_offset = 0, rows = 0, in = 0;  // the adapted weight [rows, in] in the base
    int64_t a = 0, b = 0;                       // offsets of A [r, in] and B [rows, r] here
    std::string hf_module;                      // "model.layers.0.self_attn.q_proj"
  };
  // The adapters inside the GEMM block [w, w + out·in) of the base, with their first column.
  const std::vector<std::pair<size_t, int64_t>>& block(int64_t w, int64_t in, int64_t out);
  // x, or its dropout (into xd_) for adapter i while training.
  const float* dropped(size_t i, const float* x, int64_t M, int64_t in);
  // The dropout masks' stream of adapter i in this pass (ops::dropout: one mask for the forward,
  // its recomputation and the backward).
  uint64_t mask_stream(size_t i) const { return (pass_ << 20) + i; }
  void grow(Buffer<float>* v, int64_t n) {  // in the device's memory
    if (v->size() < n) v->resize(n, be_.memory());
  }

  std::unique_ptr<Model> base_;
  LoraOptions o_;
  const ops::Backend& be_;  // fp32 kernels of the base's device
  float scale_ = 1;
  std::vector<std::string> leaves_;
  std::vector<Adapter> ad_;
  std::vector<ParamInfo> params_;
  std::optional<ParamStore> store_;  // the adapters (and their host copy off the CPU), fp32
  std::unordered_map<int64_t, std::vector<std::pair<size_t, int64_t>>> blocks_;
  Buffer<float> u_, du_, xd_;  // [M, r], [M, r], [M, in] scratch
  bool training_ = false;
  uint64_t pass_ = 0;                         // forward_backward calls: the dropout masks' counter
  std::vector<std::vector<float>> unmerged_;  // merge_adapters: the base weights as they were
};

}  // namespace titan::models
