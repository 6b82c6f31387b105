#include "titan/train/weights_check.h"

#include <cmath>
#include <cstdint>

namespace titan::train {

std::string describe_nonfinite_weights(const models::Model& m) {
  const float* p = m.store().param_data();
  const int64_t n = m.num_params();
  int64_t bad = 0, first = -1;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(p[i]);
  if (bad == 0) return "";
  for (int64_t i = 0; i < n && first < 0; ++i)
    if (!std::isfinite(p[i])) first = i;
  std::string where;
  for (const auto& info : m.params())
    if (!info.alias && first >= info.offset && first < info.offset + info.numel) where = info.fqn;
  return std::to_string(bad) + " non-finite value(s) (the first in '" + where + "')";
}

std::string initial_weights_source(const config::JobConfig& cfg) {
  const auto& k = cfg.checkpoint;
  if (!k.initial_load_path.empty())
    return "checkpoint.initial_load_path '" + k.initial_load_path + "'";
  if (k.initial_load_in_hf) return "model.hf_assets_path '" + cfg.model.hf_assets_path + "'";
  return "the seeded random init";
}

}  // namespace titan::train
