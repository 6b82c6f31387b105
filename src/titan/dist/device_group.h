// Collectives over a device's memory, per device (the distributed part of a backend,
// ops/backend.h): a factory that makes, from a host group (an MPI communicator), the group of the
// same ranks whose buffers are that device's memory. "cuda" is NCCL (dist/nccl/nccl_group.h)
// where titan was built with it; builtins.cpp lists the built-ins, and a plugin that brings a
// device registers its own. The trainer makes its data-parallel groups with them on a device.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/dist/communicator.h"

namespace titan::dist {

using DeviceGroupFactory = std::function<std::unique_ptr<Communicator>(Communicator& host)>;

// Adds the factory of `device`. Throws titan::Error for a device registered twice or an empty
// factory.
void register_device_group(const std::string& device, DeviceGroupFactory make);
bool has_device_group(const std::string& device);
// The group of `host`'s ranks over `device`'s memory (collective over host). Throws
// titan::Error naming the devices that have one when `device` has none. `host` must outlive it.
std::unique_ptr<Communicator> device_group(const std::string& device, Communicator& host);

// The factories titan has built in (src/titan/builtins.cpp), registered before the first lookup.
std::vector<std::pair<std::string, DeviceGroupFactory>> builtin_device_groups();

}  // namespace titan::dist
