// Which devices this titan can compute on: the CPU always; CUDA when it was built with the CUDA
// kernels (CMake found nvcc: ops/cuda/cuda_ops.h) and a GPU is visible.
#pragma once
#include <cstdint>
#include <string>

namespace titan::ops {

// Whether the CUDA kernels were compiled in.
bool cuda_built();
// Whether a GPU can run them; false with *why saying why (not built, no driver, no device).
bool cuda_usable(std::string* why);
// "NVIDIA H200, sm_90, 139.8 GiB" (cuda_usable() must be true).
std::string cuda_device();
// Whether `device` can compute here: cpu; cuda when titan was built with it and a GPU is visible;
// another name when a backend is registered for it. Throws titan::Error (one line, naming
// training.device: why, or the devices there are) otherwise.
void check_device(const std::string& device);
// One process per GPU: GPU index % (visible GPUs) becomes this process's (before any allocation).
void select_cuda_device(int index);

// The memory of a compute device (cuda: device 0's, cudaMemGetInfo): total and in use, bytes;
// false for a device titan cannot query (the CPU's is core/cpu.h's).
bool device_memory(const std::string& device, int64_t* total, int64_t* used);
// A large GEMM's rate on the device, FLOP/s, measured now (cuda: cuBLASLt at 8192³, bf16 inputs
// or fp32): what MFU is divided by when metrics.peak_flops is unset; 0 for a device titan cannot
// measure.
double device_gemm_flops(const std::string& device, bool bf16);

}  // namespace titan::ops
