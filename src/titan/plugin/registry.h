// The process-wide registry behind the plugin Host interface: module config types, ops (RoPE and
// grouped experts, each keyed by name, device and dtype), config functions and overrides,
// built-ins included; the plugin loader; and applying overrides
// to a module tree with torchtitan's claim/conflict rules, messages and log lines
// (torchtitan.md §2.1–§2.2).
#pragma once
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "titan/plugin/plugin_api.h"

namespace titan::plugin {

// Ops of one kind keyed by (name, device, dtype).
template <typename Op>
class OpTable {
 public:
  using Key = std::tuple<std::string, std::string, std::string>;
  // Throws titan::Error for a missing name/forward/backward or a key registered twice.
  void add(const Op& op, const std::string& kind, const std::string& origin);
  // Throws titan::Error naming what is registered under `name` when the key is absent.
  const Op& get(const std::string& kind, const std::string& name, const std::string& device,
                const std::string& dtype) const;
  std::vector<Key> keys() const;
  void clear() { ops_.clear(); }

 private:
  std::map<Key, Op> ops_;
};

class Registry : public Host {
 public:
  static Registry& global();  // with the built-in types and ops registered

  void add_config(const std::string& name, std::function<config::JobConfig()> fn) override;
  void add_module_type(const config::ModuleType& type) override;
  void add_rope_op(const ops::RopeOp& op) override;
  void add_experts_op(const ops::GroupedExpertsOp& op) override;
  void add_override(const Override& o) override;
  const config::ModuleType& module_type(const std::string& name) const override;

  const ops::RopeOp& rope_op(const std::string& name, const std::string& device = "cpu",
                             const std::string& dtype = "float32") const;
  const ops::GroupedExpertsOp& experts_op(const std::string& name,
                                          const std::string& device = "cpu",
                                          const std::string& dtype = "float32") const;
  const OpTable<ops::RopeOp>& rope_ops() const { return ropes_; }
  const OpTable<ops::GroupedExpertsOp>& experts_ops() const { return experts_; }
  const std::vector<Override>& overrides() const { return overrides_; }

  // dlopen()s a plugin (a path, or a name tried as-is and as lib<name>.so), checks its API
  // version and lets it register; loading the same library twice is a no-op. Returns the key
  // under which its overrides are recorded (the name as given). Throws titan::Error naming the
  // library for a missing file, a missing entry point, a version mismatch or an exception
  // during registration.
  std::string load(const std::string& lib);

  // Forgets everything but the built-ins (tests).
  void reset();

 private:
  Registry();
  void add_builtins();
  std::map<std::string, config::ModuleType> types_;
  OpTable<ops::RopeOp> ropes_;
  OpTable<ops::GroupedExpertsOp> experts_;
  std::vector<Override> overrides_;
  std::set<std::string> loaded_;
  std::map<std::string, std::string> config_origins_;  // plugin config functions -> library
  std::string origin_ = "titan";
};

struct OverrideReport {
  std::vector<std::string>
      lines;  // "[Override] name: fqn Old -> New", then "Applied N override(s)"
  int replaced = 0;
};

// Applies the overrides registered by the libraries in `imports` (in registration order) to the
// tree under `root` (whose path is root_fqn). Claims are collected on the unchanged tree first.
// Throws titan::Error for two overrides on one node, one on an ancestor of another's node, or a
// claim of the root. Logs each line; warns when imports are given but nothing is replaced.
OverrideReport apply_overrides(std::shared_ptr<config::ModuleNode>& root,
                               const std::string& root_fqn, const std::vector<std::string>& imports,
                               const Registry& reg = Registry::global());

// Splits "a.so,b.so" (the --override.imports form).
std::vector<std::string> split_list(const std::string& s);

}  // namespace titan::plugin
