// The plugin interface: a shared library loaded with --module or listed in --override.imports
// exports two C symbols,
//   extern "C" int  titan_plugin_api_version(void);        // must return TITAN_PLUGIN_API_VERSION
//   extern "C" void titan_plugin_register(titan::plugin::Host* host);
// and registers config functions, module config types, ops and overrides through Host. Plugins
// are built with the same compiler and standard library as titan (the interface passes C++
// types); the version number changes whenever this header changes incompatibly.
// Header-only: a plugin links nothing from titan. It depends on core/, ops/ (the op structs) and
// config/ (JobConfig, the module tree) only, never on a model's headers.
//
// Version history: 2 one table per op kind (add_rope_op, add_experts_op); 3 one generic op table
// keyed by (kind, name, device, dtype): add_op(op) for any op struct with a kKind.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/config/module_tree.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/rope_op.h"

#define TITAN_PLUGIN_API_VERSION 3

namespace titan::plugin {

// torchtitan's named override (torchtitan.md §2.2): claims nodes of type `target` (subclasses
// too unless `exact`) whose full path matches one of the shell globs `fqns` (all when empty) and
// replaces each with factory(node).
struct Override {
  std::string name;
  std::string target;
  bool exact = false;
  std::vector<std::string> fqns;
  std::string description;
  std::function<std::shared_ptr<config::ModuleNode>(const config::ModuleNode&)> factory;
  std::string origin;  // the library that registered it (set by titan)
};

// One entry of the op table: an op struct (RopeOp, GroupedExpertsOp, ...) of kind `kind`,
// type-erased. `complete`: it has a name, a forward and a backward.
struct OpEntry {
  std::string kind, name, device, dtype;
  bool complete = false;
  std::shared_ptr<const void> op;  // points to the op struct of `kind`
};

class Host {
 public:
  virtual ~Host() = default;
  virtual void add_config(const std::string& name, std::function<config::JobConfig()> fn) = 0;
  virtual void add_module_type(const config::ModuleType& type) = 0;
  // Ops: a forward/backward pair under (Op::kKind, op.name, op.device, op.dtype). A module config
  // node names its op in its "op" field; the model looks it up for its device and dtype.
  template <typename Op>
  void add_op(const Op& op) {
    add_op_entry({Op::kKind, op.name, op.device, op.dtype,
                  !op.name.empty() && op.forward && op.backward, std::make_shared<const Op>(op)});
  }
  virtual void add_op_entry(const OpEntry& e) = 0;
  virtual void add_override(const Override& o) = 0;
  // A registered module type, for derive(); throws titan::Error when unknown.
  virtual const config::ModuleType& module_type(const std::string& name) const = 0;
};

}  // namespace titan::plugin

extern "C" {
typedef int (*titan_plugin_api_version_fn)(void);
typedef void (*titan_plugin_register_fn)(titan::plugin::Host*);
}
