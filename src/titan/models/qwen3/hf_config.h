// Hugging Face config.json <-> Qwen3Args for Qwen3ForCausalLM and Qwen3MoeForCausalLM
// (qwen3-hf.md §2, §3, §6).
#pragma once
#include <string>

#include "nlohmann/json.hpp"
#include "titan/models/qwen3/args.h"

namespace titan::qwen3 {

// Reads DIR/config.json. Accepts rope_theta or rope_parameters (default-type RoPE only),
// head_dim present or absent (then hidden/heads), num_key_value_heads absent (then heads),
// torch_dtype or dtype; for qwen3_moe num_experts (or num_local_experts), num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers,
// output_router_logits, router_aux_loss_coef. Refuses, naming the field, another architecture or
// model_type, attention_bias, a sliding window switched on, a RoPE scaling type, an activation
// other than silu.
Qwen3Args args_from_hf_config(const std::string& dir);
Qwen3Args args_from_hf_json(const nlohmann::json& cfg, const std::string& where);

// config.json for args, starting from `base` (the source model's config, or empty) so that
// fields titan does not model (token ids, transformers_version, ...) are kept.
nlohmann::json hf_config_json(const Qwen3Args& a, const nlohmann::json& base,
                              const std::string& dtype);

}  // namespace titan::qwen3
