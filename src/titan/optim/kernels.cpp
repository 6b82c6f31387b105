// The optimizer's kernel registry; see kernels.h.
#include "titan/optim/kernels.h"

#include <map>
#include <memory>

#include "titan/core/error.h"

namespace titan::optim {
namespace {

using Table = std::map<std::string, std::unique_ptr<const Kernels>>;  // node-stable references

void add(Table& t, const Kernels& k) {
  check(k.adamw_step && k.sum_squares && k.clip_by_norm,
        "optimizer kernels for " + k.device +
            " are incomplete (adamw_step, sum_squares and "
            "clip_by_norm are all required)");
  check(!t.count(k.device), "optimizer kernels for " + k.device + " are already registered");
  t.emplace(k.device, std::make_unique<const Kernels>(k));
}

// Registered at start-up (built-ins on first use, then plugins), before any concurrent lookup.
Table& table() {
  static Table t = [] {
    Table init;
    for (const Kernels& k : builtin_kernels()) add(init, k);
    return init;
  }();
  return t;
}

}  // namespace

void register_kernels(const Kernels& k) { add(table(), k); }

const Kernels& kernels(const std::string& device) {
  const Table& t = table();
  if (auto it = t.find(device); it != t.end()) return *it->second;
  std::string names;
  for (const auto& [name, k] : t) names += (names.empty() ? "" : ", ") + name;
  throw Error("no optimizer kernels for device " + device + "; registered: " + names);
}

}  // namespace titan::optim
