// Device discovery and memory for the CUDA ops (ops/cuda/cuda_ops.h).
#include <cstdio>

#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear the sticky error of a failed query
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

std::string describe_device() {
  cudaDeviceProp p{};
  TITAN_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  char mem[64];
  std::snprintf(mem, sizeof mem, "%.1f GiB",
                static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         mem;
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  TITAN_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void free(void* p) {
  if (p) TITAN_CUDA_CHECK(cudaFree(p));
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void memset(void* dst, int value, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream()));
}

void synchronize() { TITAN_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace titan::ops::cuda
