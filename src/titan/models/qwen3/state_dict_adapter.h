// titan FQNs <-> Hugging Face Qwen3ForCausalLM keys (torchtitan Qwen3StateDictAdapter,
// torchtitan.md §3.5), and loading a model's weights from a Hugging Face safetensors set.
#pragma once
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::ckpt {
class SafetensorsSet;
}

namespace titan::qwen3 {

// "layers.3.attention.wq.weight" -> "model.layers.3.self_attn.q_proj.weight"; throws for an
// unknown FQN.
std::string to_hf_key(const std::string& fqn);
// The inverse; returns "" for a key titan does not map (the caller reports it as unexpected).
std::string from_hf_key(const std::string& key);

// Copies every parameter of `model` from an HF safetensors set (any of F32/BF16/F16 on disk).
// A tied model accepts lm_head.weight present or absent. Missing, unexpected and mis-shaped keys
// are all reported at once in one titan::Error naming `where`.
void load_hf_weights(Qwen3Model& model, const ckpt::SafetensorsSet& set, const std::string& where);

}  // namespace titan::qwen3
