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

models::ModelSpec model_spec();

}  // namespace titan::qwen3
