#include "titan/train/weights_check.h"

namespace titan::train {

std::string initial_weights_source(const config::JobConfig& cfg) {
  const auto& k = cfg.checkpoint;
  if (!k.initial_load_path.empty())
    return "checkpoint.initial_load_path '" + k.initial_load_path + "'";
  if (k.initial_load_in_hf) return "model.hf_assets_path '" + cfg.model.hf_assets_path + "'";
  return "the seeded random init";
}

}  // namespace titan::train
