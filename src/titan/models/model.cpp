#include "titan/models/model.h"

#include "titan/core/error.h"

namespace titan::models {

const ParamInfo& Model::param(const std::string& fqn) const {
  for (const auto& p : params())
    if (p.fqn == fqn) return p;
  throw Error("no parameter named '" + fqn + "' in the model");
}

}  // namespace titan::models
