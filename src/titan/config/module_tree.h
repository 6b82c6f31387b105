// The model's module config tree: one node per overridable module, each with a type name (as
// torchtitan's Config classes: "CosSinRoPE.Config"), the types it derives from (so an override
// of a base type also matches subclasses unless `exact`), scalar fields, and named children.
// Full paths ("FQNs") run from the root "model": model.layers.3.attention.rope.
//
// Header-only on purpose: plugins build against it without linking titan.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/error.h"

namespace titan::config {

struct ModuleNode {
  std::string type;                           // e.g. "CosSinRoPE.Config"
  std::vector<std::string> bases;             // e.g. {"RoPE.Config"}
  std::map<std::string, std::string> fields;  // e.g. {"op": "cos_sin_rope", "theta": "1000000"}
  std::vector<std::pair<std::string, std::shared_ptr<ModuleNode>>> children;

  bool is_a(const std::string& t) const {
    if (t == type) return true;
    for (const auto& b : bases)
      if (b == t) return true;
    return false;
  }
  ModuleNode* child(const std::string& name) const {
    for (const auto& [n, c] : children)
      if (n == name) return c.get();
    return nullptr;
  }
  // The node at a dotted path below this one ("layers.3.attention.rope"), or nullptr.
  ModuleNode* find(const std::string& path) {
    ModuleNode* n = this;
    size_t start = 0;
    while (n && start <= path.size()) {
      size_t dot = path.find('.', start);
      n = n->child(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return n;
  }
};

// A module config type: its name, bases and fields with defaults (what derive() fills in).
struct ModuleType {
  std::string name;
  std::vector<std::string> bases;
  std::map<std::string, std::string> defaults;
};

// torchtitan's derive(source, TargetType, **deltas): a node of `target` whose fields are the
// delta, else the source's same-named field, else the target's default; fields only the source
// has are dropped. A delta naming a field the target lacks is an error. Children are kept.
inline std::shared_ptr<ModuleNode> derive(const ModuleNode& source, const ModuleType& target,
                                          const std::map<std::string, std::string>& deltas = {}) {
  std::string unknown;
  for (const auto& [k, v] : deltas)
    if (!target.defaults.count(k)) unknown += (unknown.empty() ? "" : ", ") + k;
  if (!unknown.empty())
    throw Error("derive() got deltas for fields not on " + target.name + ": [" + unknown + "]");
  auto n = std::make_shared<ModuleNode>();
  n->type = target.name;
  n->bases = target.bases;
  n->children = source.children;
  for (const auto& [k, dflt] : target.defaults) {
    auto d = deltas.find(k);
    auto s = source.fields.find(k);
    n->fields[k] = d != deltas.end() ? d->second : s != source.fields.end() ? s->second : dflt;
  }
  return n;
}

}  // namespace titan::config
