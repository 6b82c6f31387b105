// The device records; see device.h.
#include "titan/ops/device.h"

#include <map>
#include <memory>

#include "titan/core/error.h"
#include "titan/ops/backend.h"

namespace titan::ops {
namespace {

// node-stable: lookups hand out references. Registration happens at start-up (built-ins on first
// use, then a test's or a plugin's), before any lookup from worker threads; not locked.
using Table = std::map<std::string, std::unique_ptr<const Device>>;

Table& table() {
  static Table t = [] {
    Table init;
    for (Device& d : builtin_devices()) {
      const std::string name = d.name;
      init.emplace(name, std::make_unique<const Device>(std::move(d)));
    }
    return init;
  }();
  return t;
}

}  // namespace

void register_device(Device d) {
  check(!table().count(d.name), "a device named " + d.name + " is already registered");
  const std::string name = d.name;
  table().emplace(name, std::make_unique<const Device>(std::move(d)));
}

const Device& device(const std::string& name) {
  Table& t = table();
  if (auto it = t.find(name); it != t.end()) return *it->second;
  // A device known only by its backends: a plain record, kept for later lookups.
  std::string devices;
  bool known = false;
  for (const std::string& b : registered_backends()) {
    const std::string d = b.substr(0, b.find('/'));
    known |= d == name;
    if (devices.find(d) == std::string::npos) devices += (devices.empty() ? "" : ", ") + d;
  }
  check(known, "training.device '" + name + "' is not a known device; use cpu or cuda (" +
                   "devices with kernels here: " + devices + ")");
  Device d;
  d.name = name;
  d.usable = [](std::string*) { return true; };
  d.describe = [] { return std::string("a registered backend"); };
  return *t.emplace(name, std::make_unique<const Device>(std::move(d))).first->second;
}

void check_device(const std::string& name) {
  const Device& d = device(name);
  std::string why;
  const bool usable = !d.usable || d.usable(&why);  // before the message is made of why
  check(usable, "training.device " + name + ": " + why);
}

}  // namespace titan::ops
