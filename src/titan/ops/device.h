// Which devices this titan can compute on: the CPU always; CUDA when it was built with the CUDA
// kernels (CMake found nvcc: ops/cuda/cuda_ops.h) and a GPU is visible.
#pragma once
#include <string>

namespace titan::ops {

// Whether the CUDA kernels were compiled in.
bool cuda_built();
// Whether a GPU can run them; false with *why saying why (not built, no driver, no device).
bool cuda_usable(std::string* why);
// "NVIDIA H200, sm_90, 139.8 GiB" (cuda_usable() must be true).
std::string cuda_device();

}  // namespace titan::ops
