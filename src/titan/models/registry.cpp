#include "titan/models/registry.h"

#include <fstream>
#include <map>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/models/lora.h"
#include "titan/models/qwen3/spec.h"
#include "titan/ops/device.h"
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

LoraOptions lora_options(const config::JobConfig& cfg, uint64_t seed) {
  const config::LoraConfig& c = cfg.lora;
  LoraOptions o;
  o.rank = c.rank;
  o.alpha = c.alpha;
  o.dropout = c.dropout;
  o.target_modules = c.target_modules;
  o.use_rslora = c.use_rslora;
  o.seed = seed;
  o.base_name_or_path = cfg.model.hf_assets_path;
  if (c.adapter_path.empty()) return o;
  // A PEFT adapter: its adapter_config.json decides the shape of the adapters.
  const std::string file = c.adapter_path + "/adapter_config.json";
  read_adapter_config(file, &o);
  return o;
}

std::unique_ptr<Model> build_model(const config::JobConfig& cfg, const BuildOptions& opt) {
  ops::check_device(opt.device);
  const ModelSpec& spec = model_spec(cfg.model.name);
  auto tree = overridden_module_tree(cfg, opt.seq_len, opt.log_overrides);
  const bool lora = cfg.lora.rank > 0 || !cfg.lora.adapter_path.empty();
  BuildOptions bo = opt;
  if (lora) {  // the base of the adapters is frozen: its weights (and their bf16 copy) alone, no
               // gradients nor AdamW moments
    bo.trainable = false;
    if (bo.bytes_per_param > 0) {
      bo.bytes_per_param = 4 + (cfg.training.mixed_precision_param == "bfloat16" ? 2 : 0);
      bo.bytes_hold = "frozen parameters";
    }
  }
  std::unique_ptr<Model> m = spec.build(cfg, *tree, bo);
  if (opt.init && opt.allocate) m->init_weights(opt.seed);
  if (lora)
    m = std::make_unique<LoraModel>(std::move(m), lora_options(cfg, opt.seed), opt.allocate);
  return m;
}

}  // namespace titan::models
