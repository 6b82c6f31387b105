// The optimizer's kernels per device (the optimizer's part of a backend, ops/backend.h): AdamW,
// the gradient's Σ g² and clipping, with optim/adamw.h's signatures and semantics, their arrays
// in the device's memory. "cpu" is adamw.h's functions; builtins.cpp lists the others (cuda:
// optim/cuda/adamw.h); a plugin that brings a device registers its own.
#pragma once
#include <string>
#include <vector>

#include "titan/optim/adamw.h"

namespace titan::optim {

struct Kernels {
  std::string device;  // as the backend's (ops/backend.h)
  decltype(&optim::adamw_step) adamw_step = nullptr;
  decltype(&optim::sum_squares) sum_squares = nullptr;
  decltype(&optim::clip_by_norm) clip_by_norm = nullptr;
  // Optional: the update with bf16 moments (optimizer.state_dtype bfloat16); null refuses it.
  decltype(&optim::adamw_step_bf16) adamw_step_bf16 = nullptr;
  // Optional: the update with 8-bit moments (optimizer.state_dtype int8); null refuses it.
  decltype(&optim::adamw_step_q8) adamw_step_q8 = nullptr;
};

// Adds the kernels of k.device. Throws titan::Error for a missing entry or a device registered
// twice.
void register_kernels(const Kernels& k);
// The kernels of `device`; throws titan::Error naming the registered devices when there are none.
const Kernels& kernels(const std::string& device);

// The kernels titan has built in (src/titan/builtins.cpp), registered before the first lookup.
std::vector<Kernels> builtin_kernels();

}  // namespace titan::optim
