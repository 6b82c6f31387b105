// titan FQNs <-> Hugging Face Qwen3ForCausalLM / Qwen3MoeForCausalLM keys (torchtitan
// Qwen3StateDictAdapter, torchtitan.md §3.5; qwen3-hf.md §2, §4), and loading a model's weights
// from a Hugging Face safetensors set. Stacked experts (layers.N.moe.experts.w1 [E,F,D], w3
// [E,F,D], w2 [E,D,F]) are E per-expert tensors on disk:
// model.layers.N.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight.
#pragma once
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

using models::HfTensor;

// Every HF tensor of the model (the tied lm_head omitted), experts split per expert; the offsets
// are those of a model built whole.
std::vector<HfTensor> hf_tensors(const Qwen3Model& model);

// "layers.3.attention.wq.weight" -> "model.layers.3.self_attn.q_proj.weight"; throws for an
// unknown FQN or a stacked expert tensor (which has E keys: see hf_tensors).
std::string to_hf_key(const std::string& fqn);
// The inverse; returns "" for a key titan does not map (the caller reports it as unexpected).
std::string from_hf_key(const std::string& key);

// Copies every parameter of `model` from an HF state dict (a safetensors set) (any of F32/BF16/F16
// on disk). A tied model accepts lm_head.weight present or absent; MoE experts are read per expert
// or from the fused layout (mlp.experts.gate_up_proj [E,2F,D], mlp.experts.down_proj [E,D,F]).
// Missing, unexpected and mis-shaped keys are all reported at once in one titan::Error naming
// `where`. A model built for a tensor/expert-parallel slice reads just its slices (runs of the
// whole tensors, models::for_each_whole_run); `only` limits the reads to those ranges of the flat
// parameter buffer (a sharded trainer's).
void load_hf_weights(Qwen3Model& model, const TensorSource& set, const std::string& where,
                     const std::vector<models::FlatRange>* only = nullptr);

// The model's models::StateDictAdapter (Qwen3Model::hf()): the functions above and config.json
// (hf_config.h). A model built for a tensor-parallel slice has no HF tensors of its own (the
// trainer gathers a whole model first).
class Qwen3StateDictAdapter final : public models::StateDictAdapter {
 public:
  explicit Qwen3StateDictAdapter(Qwen3Model& model) : m_(model) {}
  std::vector<HfTensor> hf_tensors() const override;
  void load_hf(const TensorSource& src, const std::string& where,
               const std::vector<models::FlatRange>* only = nullptr) override {
    load_hf_weights(m_, src, where, only);
  }
  nlohmann::json hf_config(const nlohmann::json& base, const std::string& dtype) const override;

 private:
  Qwen3Model& m_;
};

}  // namespace titan::qwen3
