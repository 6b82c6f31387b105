#include "titan/plugin/registry.h"

#include <dlfcn.h>
#include <fnmatch.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::plugin {

void OpTable::add(const OpEntry& e, const std::string& origin) {
  check(e.complete && e.op, "plugin '" + origin + "' registered a " + e.kind +
                                " op without a name, forward or backward");
  Key k{e.kind, e.name, e.device, e.dtype};
  check(!ops_.count(k), e.kind + " op '" + e.name + "' for " + e.device + "/" + e.dtype +
                            " is already registered; plugin '" + origin +
                            "' must pick another name");
  ops_[k] = e.op;
}

const void* OpTable::get(const std::string& kind, const std::string& name,
                         const std::string& device, const std::string& dtype) const {
  auto it = ops_.find(Key{kind, name, device, dtype});
  if (it != ops_.end()) return it->second.get();
  std::string have;
  for (const auto& [k, op] : ops_)
    if (std::get<0>(k) == kind && std::get<1>(k) == name)
      have += (have.empty() ? "" : ", ") + std::get<2>(k) + "/" + std::get<3>(k);
  throw Error("no " + kind + " op named '" + name + "' is registered for " + device + "/" + dtype +
              (have.empty() ? " (load its plugin with --override.imports or --module)"
                            : "; it exists for " + have));
}

void Registry::reset() {
  types_.clear();
  ops_.clear();
  overrides_.clear();
  loaded_.clear();
  config_origins_.clear();
  register_builtins(*this);
}

void Registry::add_config(const std::string& name, std::function<config::JobConfig()> fn) {
  auto mine = config_origins_.find(name);
  bool taken = mine != config_origins_.end() && mine->second != origin_;
  if (mine == config_origins_.end())
    for (const auto& n : config::config_names()) taken |= n == name;  // a built-in name
  check(!taken, "config function '" + name + "' is already registered; plugin '" + origin_ +
                    "' must pick another name");
  config_origins_[name] = origin_;
  config::register_config(name, std::move(fn));
}

void Registry::add_module_type(const config::ModuleType& type) {
  check(!types_.count(type.name), "module config type '" + type.name +
                                      "' is already registered; plugin '" + origin_ +
                                      "' must pick another name");
  for (const auto& b : type.bases)
    check(types_.count(b),
          "module config type '" + type.name + "' derives from unknown type '" + b + "'");
  types_[type.name] = type;
}

void Registry::add_op_entry(const OpEntry& e) { ops_.add(e, origin_); }

void Registry::add_override(const Override& o) {
  for (const auto& e : overrides_)
    check(e.name != o.name, "Override '" + o.name + "' is already registered (by module '" +
                                e.origin +
                                "'). Each override name must be unique across all "
                                "imported modules.");
  check(types_.count(o.target), "override('" + o.name +
                                    "', target=...) must be a registered module "
                                    "config type, got '" +
                                    o.target + "'");
  check(static_cast<bool>(o.factory), "override '" + o.name + "' has no factory");
  Override copy = o;
  copy.origin = origin_;
  overrides_.push_back(std::move(copy));
}

const config::ModuleType& Registry::module_type(const std::string& name) const {
  auto it = types_.find(name);
  check(it != types_.end(), "unknown module config type '" + name + "'");
  return it->second;
}

namespace {
// The loaded plugins, as a crash handler may read them: each one's object name as dladdr reports
// it (its link map's l_name) and its library name as given.
struct LoadedObject {
  const char* object;
  char lib[256];
};
LoadedObject g_objects[64];
std::atomic<int> g_n_objects{0};
}  // namespace

const char* plugin_at(const void* pc) {
  Dl_info info;
  if (pc == nullptr || dladdr(pc, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  const int n = g_n_objects.load();
  for (int i = 0; i < n; ++i)
    if (std::strcmp(g_objects[i].object, info.dli_fname) == 0) return g_objects[i].lib;
  return nullptr;
}

std::string Registry::load(const std::string& lib) {
  if (loaded_.count(lib)) return lib;
  if (lib.find('/') != std::string::npos)
    check_plugin_file(lib, lib);  // a path, not a library name
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string err = h ? "" : dlerror();
  if (!h && lib.find('/') == std::string::npos) {
    h = dlopen(("lib" + lib + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) err += "; " + std::string(dlerror());
  }
  check(h != nullptr, "cannot load plugin '" + lib + "': " + err);
  // Recorded before any of its code runs, so that a crash in it is attributed to it.
  const int slot = g_n_objects.load();
  link_map* lm = nullptr;
  const bool recorded = slot < 64 && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name;
  if (recorded) {
    g_objects[slot].object = lm->l_name;
    std::snprintf(g_objects[slot].lib, sizeof g_objects[slot].lib, "%s", lib.c_str());
    g_n_objects = slot + 1;
  }
  const auto unload = [&] {
    if (recorded) g_n_objects = slot;
    dlclose(h);
  };
  auto version =
      reinterpret_cast<titan_plugin_api_version_fn>(dlsym(h, "titan_plugin_api_version"));
  auto reg = reinterpret_cast<titan_plugin_register_fn>(dlsym(h, "titan_plugin_register"));
  if (!version || !reg) {
    unload();
    throw Error("plugin '" + lib + "' lacks the entry point " +
                (version ? "titan_plugin_register" : "titan_plugin_api_version") +
                "; see src/titan/plugin/plugin_api.h");
  }
  const int v = version();
  if (v != TITAN_PLUGIN_API_VERSION) {
    unload();
    throw Error("plugin '" + lib + "' was built for plugin API version " + std::to_string(v) +
                ", this titan has version " + std::to_string(TITAN_PLUGIN_API_VERSION) +
                "; rebuild the plugin against this titan");
  }
  origin_ = lib;
  try {
    reg(this);
  } catch (const std::exception& e) {
    origin_ = "titan";
    throw Error("plugin '" + lib + "' failed while registering: " + e.what());
  } catch (...) {
    origin_ = "titan";
    throw Error("plugin '" + lib +
                "' failed while registering: it threw something that is not a std::exception");
  }
  origin_ = "titan";
  loaded_.insert(lib);  // the handle stays open: registered functions live in it
  return lib;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> r;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) r.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return r;
}

namespace {

struct Claim {
  const Override* ov;
  std::string fqn;
  config::ModuleNode* parent;  // nullptr: the root
  size_t index;
};

// torchtitan's traverse(target): every node that is_a target, not descending into a match.
void collect(const Override& ov, config::ModuleNode* node, config::ModuleNode* parent, size_t index,
             const std::string& fqn, std::vector<Claim>* out) {
  if (node->is_a(ov.target)) {  // descent stops at a match (subclasses included)
    if (ov.exact && node->type != ov.target) return;
    bool selected = ov.fqns.empty();
    for (const auto& pat : ov.fqns) selected |= fnmatch(pat.c_str(), fqn.c_str(), 0) == 0;
    if (selected) out->push_back({&ov, fqn, parent, index});
    return;
  }
  for (size_t i = 0; i < node->children.size(); ++i)
    collect(ov, node->children[i].second.get(), node, i, fqn + "." + node->children[i].first, out);
}

}  // namespace

OverrideReport apply_overrides(std::shared_ptr<config::ModuleNode>& root,
                               const std::string& root_fqn, const std::vector<std::string>& imports,
                               const Registry& reg, bool verbose) {
  OverrideReport rep;
  if (imports.empty()) return rep;
  std::set<std::string> origins(imports.begin(), imports.end());
  std::vector<Claim> claims;
  for (const auto& ov : reg.overrides())
    if (origins.count(ov.origin)) collect(ov, root.get(), nullptr, 0, root_fqn, &claims);
  for (size_t i = 0; i < claims.size(); ++i) {
    check(claims[i].parent != nullptr, "Override '" + claims[i].ov->name +
                                           "' claims root config '" + claims[i].fqn +
                                           "', which cannot be replaced in place.");
    for (size_t j = 0; j < i; ++j) {
      const Claim &a = claims[j], &b = claims[i];
      if (a.fqn == b.fqn)
        throw Error("Overrides '" + a.ov->name + "' and '" + b.ov->name + "' both claim node '" +
                    a.fqn + "'. Narrow their `fqns` selectors so they target disjoint nodes.");
      const Claim* anc = b.fqn.rfind(a.fqn + ".", 0) == 0   ? &a
                         : a.fqn.rfind(b.fqn + ".", 0) == 0 ? &b
                                                            : nullptr;
      if (anc) {
        const Claim* desc = anc == &a ? &b : &a;
        throw Error("Override '" + anc->ov->name + "' claims '" + anc->fqn + "', an ancestor of '" +
                    desc->fqn + "' claimed by '" + desc->ov->name +
                    "'. Nested overrides are order-dependent; narrow their `fqns` selectors.");
      }
    }
  }
  for (const auto& c : claims) {
    auto& slot = c.parent->children[c.index].second;
    const std::string old_type = slot->type;
    std::shared_ptr<config::ModuleNode> repl = c.ov->factory(*slot);
    check(repl != nullptr, "override '" + c.ov->name + "' returned no config for '" + c.fqn + "'");
    slot = std::move(repl);
    rep.lines.push_back("[Override] " + c.ov->name + ": " + c.fqn + " " + old_type + " -> " +
                        slot->type);
    if (verbose) log::info(rep.lines.back());
    ++rep.replaced;
  }
  rep.lines.push_back("Applied " + std::to_string(rep.replaced) + " override(s)");
  if (!verbose) return rep;
  log::info(rep.lines.back());
  if (rep.replaced == 0) {
    std::string list;
    for (const auto& i : imports) list += (list.empty() ? "" : ", ") + ("'" + i + "'");
    log::warn(
        "override.imports=[" + list +
        "] produced no replacements. Check that the imported "
        "modules register overrides whose `target` and `fqns` match nodes in the config tree.");
  }
  return rep;
}

}  // namespace titan::plugin
