// Qwen3 (dense and MoE) as a registered model (models/registry.h): its arguments from a config
// (flavor or Hugging Face config.json, then the model.* overrides), validation, description,
// module tree and build.
#pragma once
#include "titan/config/job_config.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/registry.h"

namespace titan::qwen3 {

// The flavor (or model.hf_assets_path's config.json) with the config's model.* overrides
// applied, validated.
Qwen3Args args_from_config(const config::JobConfig& c);

// Throws titan::Error (naming `source`, the sizes, `what` they hold and what to reduce) when the
// parameters of `a` at bytes_per_param bytes each exceed memory_bytes; memory_bytes <= 0
// (unknown) passes.
void check_fits_in_memory(const Qwen3Args& a, int64_t bytes_per_param, const std::string& what,
                          int64_t memory_bytes, const std::string& source);

// Where a config's architecture comes from, for messages: "flavor 'debugmodel'" or
// "DIR/config.json".
std::string model_source(const config::JobConfig& c);

models::ModelSpec model_spec();

}  // namespace titan::qwen3
