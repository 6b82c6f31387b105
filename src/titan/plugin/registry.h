// The process-wide registry behind the plugin Host interface: module config types, ops (one table
// keyed by kind, name, device and dtype), config functions and overrides, built-ins included; the
// plugin loader; and applying overrides to a module tree with torchtitan's claim/conflict rules,
// messages and log lines (torchtitan.md §2.1–§2.2).
#pragma once
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "titan/plugin/plugin_api.h"

namespace titan::plugin {

// The op table: every op struct keyed by (kind, name, device, dtype).
class OpTable {
 public:
  using Key = std::tuple<std::string, std::string, std::string, std::string>;
  // Throws titan::Error for an incomplete op or a key registered twice.
  void add(const OpEntry& e, const std::string& origin);
  // Throws titan::Error naming what is registered under (kind, name) when the key is absent.
  const void* get(const std::string& kind, const std::string& name, const std::string& device,
                  const std::string& dtype) const;
  bool has(const std::string& kind, const std::string& name, const std::string& device,
           const std::string& dtype) const {
    return ops_.count(Key{kind, name, device, dtype}) > 0;
  }
  void clear() { ops_.clear(); }

 private:
  std::map<Key, std::shared_ptr<const void>> ops_;
};

class Registry;
void register_builtins(Registry& reg);

// The library name of the loaded plugin whose code holds address pc, or nullptr (titan's own
// code, a system library). For the crash handler: it reads a fixed table and calls dladdr only.
const char* plugin_at(const void* pc);

// The checks a plugin file passes before dlopen maps it (a truncated or corrupt shared object
// would otherwise fault inside the dynamic loader): a regular file with a 64-bit ELF header of
// this machine's architecture, a shared object whose program headers, loadable segments and
// section header table lie within the file. Throws titan::Error "cannot load plugin 'lib': ..."
// naming the cause.
void check_plugin_file(const std::string& path, const std::string& lib);

class Registry : public Host {
 public:
  static Registry& global();  // with the built-in types and ops registered

  void add_config(const std::string& name, std::function<config::JobConfig()> fn) override;
  void add_module_type(const config::ModuleType& type) override;
  void add_op_entry(const OpEntry& e) override;
  void add_override(const Override& o) override;
  const config::ModuleType& module_type(const std::string& name) const override;

  // The op of type Op (its kind) under (name, device, dtype).
  template <typename Op>
  const Op& op(const std::string& name, const std::string& device = "cpu",
               const std::string& dtype = "float32") const {
    return *static_cast<const Op*>(ops_.get(Op::kKind, name, device, dtype));
  }
  const OpTable& ops() const { return ops_; }
  const std::vector<Override>& overrides() const { return overrides_; }

  // dlopen()s a plugin (a path, or a name tried as-is and as lib<name>.so), checks its API
  // version and lets it register; loading the same library twice is a no-op. Returns the key
  // under which its overrides are recorded (the name as given). Throws titan::Error naming the
  // library for a missing file, a missing entry point, a version mismatch or an exception
  // during registration.
  std::string load(const std::string& lib);

  // Forgets everything but the built-ins (tests).
  void reset();
  // Registers everything titan has built in (module types, ops): src/titan/builtins.cpp, the
  // one place that knows every model and backend.
  friend void register_builtins(Registry& reg);

 private:
  Registry() = default;
  std::map<std::string, config::ModuleType> types_;
  OpTable ops_;
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
// claim of the root. Logs each line (when `verbose`); warns when imports are given but nothing is
// replaced.
OverrideReport apply_overrides(std::shared_ptr<config::ModuleNode>& root,
                               const std::string& root_fqn, const std::vector<std::string>& imports,
                               const Registry& reg = Registry::global(), bool verbose = true);

// Splits "a.so,b.so" (the --override.imports form).
std::vector<std::string> split_list(const std::string& s);

}  // namespace titan::plugin
