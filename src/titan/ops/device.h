// The compute devices (training.device), one record each (ggml's ggml_backend_device idea): what
// the device is, whether it runs here, its memory, its measured GEMM rate and what the memory
// plan adds for it. The records are registered once (builtins.cpp: the CPU always; CUDA when
// titan was built with it); nothing else compares device names. Its kernels are the backend
// tables of its name (ops/backend.h), its optimizer kernels optim/kernels.h's and its collectives
// dist/device_group.h's, each registered in builtins.cpp under the same name.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace titan::ops {

struct Device {
  std::string name;   // training.device's value: "cpu", "cuda", ...
  bool host = false;  // computes in host memory (the CPU): no device memory, no host copy
  // Whether it can compute here; false with *why saying why (not built, no driver, no device).
  std::function<bool(std::string* why)> usable;
  // "NVIDIA H200, sm_90, 139.8 GiB" (usable() must be true), and what it keeps where and
  // computes in which precision, for the log (bf16: mixed precision); either may be null.
  std::function<std::string()> describe;
  std::function<std::string(bool bf16)> precision;
  // One process per device: index % (visible devices) becomes this process's, before any
  // allocation; null where there is nothing to choose.
  std::function<void(int index)> select;
  // Total and in-use bytes of its memory; null or false where they cannot be queried (the CPU's
  // are core/cpu.h's).
  std::function<bool(int64_t* total, int64_t* used)> memory;
  // A large GEMM's rate, FLOP/s, measured now (bf16 inputs or fp32): what MFU divides by when
  // metrics.peak_flops is unset; null where it is not measured.
  std::function<double(bool bf16)> gemm_flops;
  // Why several processes cannot share it when no collectives over its memory are registered
  // (dist/device_group.h); empty: the general reason is given.
  std::string no_collectives;
  // ---- the memory plan (tools/memory_plan.h)
  // The mapping granule of its reserved buffers (core/device.h reserve): the one two FSDP units
  // share stays mapped in each flat buffer; 0 where it has none.
  int64_t granule = 0;
  // Its runtime's own memory (context, kernels, workspaces), an estimate, with its label.
  std::pair<std::string, int64_t> runtime_memory;
  // The GEMM probe gemm_flops runs at start (label, bytes), bf16 or fp32; null: none.
  std::function<std::pair<std::string, int64_t>(bool bf16)> probe_memory;
};

// The record of `name`: a registered one, or for a name with backends registered but no record
// (ops::register_backend), a plain one saying so. Throws titan::Error (one line naming
// training.device and the devices there are) for an unknown name.
const Device& device(const std::string& name);
// device(name), and throws titan::Error ("training.device NAME: why") when it cannot compute here.
void check_device(const std::string& name);
// Adds a record (before the first lookup, or a test's own).
void register_device(Device d);
// The built-in records (builtins.cpp).
std::vector<Device> builtin_devices();

}  // namespace titan::ops
