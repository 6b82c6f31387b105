// What the CUDA sources of ops/cuda share (not included outside this folder): error checks that
// throw titan::Error naming the call, the stream every kernel runs on, grid sizes, and stream-
// ordered temporary device memory.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "titan/core/error.h"

namespace titan::ops::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(e));
}
#define TITAN_CUDA_CHECK(call) ::titan::ops::cuda::check_cuda((call), #call)
// After a launch: a bad configuration shows at once, a fault at the next synchronization.
#define TITAN_CUDA_LAUNCHED(name) ::titan::ops::cuda::check_cuda(cudaGetLastError(), name)

// The stream every op runs on (the legacy default stream: ops run in call order).
inline cudaStream_t stream() { return cudaStreamLegacy; }

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}

// The first t with v[t] (device int32) outside [lo, hi) and not equal to `allowed`
// (kNoException: none allowed), or −1; *value (when given) gets that v[t]. Reads back to the host
// (the ops that check their indices before use, as the CPU ops do). elementwise.cu.
constexpr int64_t kNoException = INT64_MIN;
int64_t first_outside(const int32_t* v, int64_t n, int64_t lo, int64_t hi, int64_t allowed,
                      int32_t* value);

// Waits for the stream, unmaps the granules reserved ranges gave back (runtime.cu: their unmap
// is deferred until the kernels before have run) and trims the stream-ordered pool (the Temp
// buffers it keeps until a synchronization): what an allocation that failed for want of memory
// tries before giving up.
void reclaim();

// Device memory for one op's temporaries, freed in stream order when it goes out of scope.
template <typename T>
class Temp {
 public:
  explicit Temp(int64_t n) {
    if (n <= 0) return;
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, stream());
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      reclaim();
      e = cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, stream());
    }
    check_cuda(e, "cudaMallocAsync (an op's temporary)");
  }
  ~Temp() {
    if (p_) cudaFreeAsync(p_, stream());
  }
  Temp(const Temp&) = delete;
  Temp& operator=(const Temp&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// The sum (or maximum) of v over the block's threads, returned to every thread (blockDim.x a
// multiple of 32, at most 1024). Warp shuffles, then the warps' results in warp order: a fixed
// order for a given block size.
template <bool Max>
__device__ float block_reduce(float v) {
  __shared__ float warp_part[32];
  auto op = [](float a, float b) { return Max ? fmaxf(a, b) : a + b; };
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  if (warp == 0) {  // only warp 0 reads the parts back: nothing reads warp_part[0] as it changes
    v = lane < warps ? warp_part[lane] : (Max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) warp_part[0] = v;
  }
  __syncthreads();
  const float r = warp_part[0];
  __syncthreads();  // warp_part is reused by the next call
  return r;
}
inline __device__ float block_sum(float v) { return block_reduce<false>(v); }
inline __device__ float block_max(float v) { return block_reduce<true>(v); }

}  // namespace titan::ops::cuda
