// The device-group registry; see device_group.h.
#include "titan/dist/device_group.h"

#include <map>

#include "titan/core/error.h"

namespace titan::dist {
namespace {

using Table = std::map<std::string, DeviceGroupFactory>;

void add(Table& t, const std::string& device, DeviceGroupFactory make) {
  check(static_cast<bool>(make), "the device group factory of " + device + " is empty");
  check(!t.count(device), "a device group for " + device + " is already registered");
  t.emplace(device, std::move(make));
}

// Registered at start-up (built-ins on first use, then plugins), before any concurrent lookup.
Table& table() {
  static Table t = [] {
    Table init;
    for (auto& [device, make] : builtin_device_groups()) add(init, device, std::move(make));
    return init;
  }();
  return t;
}

}  // namespace

void register_device_group(const std::string& device, DeviceGroupFactory make) {
  add(table(), device, std::move(make));
}

bool has_device_group(const std::string& device) { return table().count(device) > 0; }

std::unique_ptr<Communicator> device_group(const std::string& device, Communicator& host) {
  const Table& t = table();
  if (auto it = t.find(device); it != t.end()) return it->second(host);
  std::string names;
  for (const auto& [name, make] : t) names += (names.empty() ? "" : ", ") + name;
  throw Error("no collectives over " + device + " memory are registered (devices that have them: " +
              (names.empty() ? std::string("none") : names) + ")");
}

}  // namespace titan::dist
