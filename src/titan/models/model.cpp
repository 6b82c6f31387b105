#include "titan/models/model.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "titan/core/buffer.h"
#include "titan/core/error.h"

namespace titan::models {

const ParamInfo& Model::param(const std::string& fqn) const {
  for (const auto& p : params())
    if (p.fqn == fqn) return p;
  throw Error("no parameter named '" + fqn + "' in the model");
}

Generator& Model::generation() {
  Generator* g = generator();
  check(g != nullptr, "this model does not support generation (no key/value cache)");
  return *g;
}

double attention_flops_per_token(const ModelDims& d, int64_t seq_len, bool causal) {
  const double square = 12.0 * static_cast<double>(d.layers * d.heads * d.head_dim * seq_len);
  return causal ? square / 2 : square;
}

std::vector<ParamUnit> param_units(const std::vector<ParamInfo>& params) {
  std::vector<ParamUnit> u;
  for (const auto& p : params) {
    if (p.alias) continue;
    const auto g = static_cast<size_t>(p.group);
    if (u.size() <= g) u.resize(g + 1, {p.offset, p.offset});
    check(u[g].begin == u[g].end || u[g].end == p.offset,
          "parameter '" + p.fqn + "' does not follow the others of its group in the flat buffer");
    if (u[g].begin == u[g].end) u[g].begin = p.offset;
    u[g].end = p.offset + p.numel;
  }
  return u;
}

AcPolicy AcPolicy::from_config(const std::string& mode, const std::string& option) {
  AcPolicy p;
  if (mode == "full") {
    p.mode = Mode::full;
  } else if (mode == "selective") {
    if (option == "op") {
      p.mode = Mode::op;
    } else {
      p.mode = Mode::full;
      p.every = std::stoll(option);
    }
  } else {
    check(mode == "none",
          "activation_checkpoint.mode '" + mode + "' must be none, selective or full");
  }
  return p;
}

std::string AcPolicy::describe() const {
  if (mode == Mode::none) return "none";
  if (mode == Mode::op) return "selective op";
  return every == 1 ? "full" : "selective every " + std::to_string(every) + " blocks";
}

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

}  // namespace titan::models
