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

void set_device(int index) {
  int n = 0;
  TITAN_CUDA_CHECK(cudaGetDeviceCount(&n));
  TITAN_CUDA_CHECK(cudaSetDevice(index % n));
}

namespace {
int n_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
}  // namespace

std::string describe_device() {
  int dev = 0;
  TITAN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  TITAN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char mem[64];
  std::snprintf(mem, sizeof mem, "%.1f GiB",
                static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         mem + (n_devices() > 1 ? ", device " + std::to_string(dev) : std::string());
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "out of GPU memory: %.2f GiB asked, %.2f GiB free of %.2f GiB (titan plan "
                  "--training.device cuda shows what a run needs; lower training.local_batch_size "
                  "or training.seq_len, or set activation_checkpoint.mode full)",
                  static_cast<double>(bytes) / (1ull << 30),
                  static_cast<double>(free_b) / (1ull << 30),
                  static_cast<double>(total) / (1ull << 30));
    throw Error(msg);
  }
  TITAN_CUDA_CHECK(e);
  return p;
}

void free(void* p) {
  if (p) cudaFree(p);  // from destructors: never throws (a fault shows at the next check)
}

void memory_info(int64_t* total, int64_t* used) {
  size_t free_b = 0, total_b = 0;
  TITAN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  *total = static_cast<int64_t>(total_b);
  *used = static_cast<int64_t>(total_b - free_b);
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void memset(void* dst, int value, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream()));
}

void synchronize() { TITAN_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace titan::ops::cuda
