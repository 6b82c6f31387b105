// Where a tensor's storage lives. Only CPU is allocated today; the names match the op
// registry's device strings ("cpu").
#pragma once
#include <string>

#include "titan/core/error.h"

namespace titan {

enum class Device { CPU, CUDA };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// The inverse of device_name. Throws titan::Error for any other string.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::CPU;
  if (s == "cuda") return Device::CUDA;
  throw Error("unknown device '" + s + "' (expected cpu or cuda)");
}

}  // namespace titan
