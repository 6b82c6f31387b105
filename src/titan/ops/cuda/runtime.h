// What the CUDA sources of ops/cuda share (not included outside this folder): error checks that
// throw titan::Error naming the call, the stream every kernel runs on, grid sizes, and stream-
// ordered temporary device memory.
#pragma once
#include <cuda_runtime.h>

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

// Device memory for one op's temporaries, freed in stream order when it goes out of scope.
template <typename T>
class Temp {
 public:
  explicit Temp(int64_t n) {
    if (n > 0)
      TITAN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_),
                                       static_cast<size_t>(n) * sizeof(T), stream()));
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

}  // namespace titan::ops::cuda
