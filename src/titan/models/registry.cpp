#include "titan/models/registry.h"

#include <map>

#include "titan/core/error.h"
#include "titan/models/qwen3/spec.h"
#include "titan/plugin/registry.h"

namespace titan::models {
namespace {
const std::map<std::string, ModelSpec>& specs() {
  static const std::map<std::string, ModelSpec> s = [] {
    std::map<std::string, ModelSpec> m;
    for (ModelSpec spec : {qwen3::model_spec()}) m[spec.name] = std::move(spec);
    return m;
  }();
  return s;
}
}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> n;
  for (const auto& [k, v] : specs()) n.push_back(k);
  return n;
}

const ModelSpec& model_spec(const std::string& name) {
  auto it = specs().find(name);
  if (it != specs().end()) return it->second;
  std::string names;
  for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("model.name '" + name + "' is not supported; use " + names);
}

void validate_model_config(const config::JobConfig& cfg) {
  model_spec(cfg.model.name).validate(cfg);
}

std::shared_ptr<config::ModuleNode> overridden_module_tree(const config::JobConfig& cfg,
                                                           int64_t seq_len, bool log) {
  auto tree = model_spec(cfg.model.name).module_tree(cfg, seq_len);
  std::vector<std::string> imports = plugin::split_list(cfg.override_.imports);
  for (const auto& lib : imports) plugin::Registry::global().load(lib);
  plugin::apply_overrides(tree, "model", imports, plugin::Registry::global(), log);
  return tree;
}

std::unique_ptr<Model> build_model(const config::JobConfig& cfg, const BuildOptions& opt) {
  const ModelSpec& spec = model_spec(cfg.model.name);
  auto tree = overridden_module_tree(cfg, opt.seq_len, opt.log_overrides);
  std::unique_ptr<Model> m = spec.build(cfg, *tree, opt);
  if (opt.init && opt.allocate) m->init_weights(opt.seed);
  return m;
}

}  // namespace titan::models
