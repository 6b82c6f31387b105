// AdamW's state for one rank's shard of the parameters (n elements): the two moments exp_avg (m)
// and exp_avg_sq (v), stored in float32 or bfloat16 (optimizer.state_dtype) in a device's memory.
// Bytes per parameter: 8 in float32, 4 in bfloat16 (stochastically rounded on each update,
// optim/adamw_math.h).
#pragma once
#include <cstdint>
#include <string>

#include "titan/core/buffer.h"
#include "titan/core/dtype.h"
#include "titan/optim/kernels.h"

namespace titan::optim {

class AdamWState {
 public:
  AdamWState() = default;
  // Zeroed moments of n elements. Throws titan::Error for a dtype other than F32 and BF16.
  AdamWState(DType dtype, int64_t n, const DeviceMemory& mem);

  DType dtype() const { return dtype_; }
  int64_t size() const { return n_; }
  void* m() { return m_.data(); }
  void* v() { return v_.data(); }
  const DeviceMemory& memory() const { return m_.memory(); }

  // One AdamW update of p[0:n) with the gradient g[0:n) through the kernels of the state's device;
  // key: this step's random stream for the stochastic rounding (bf16 moments). Throws
  // titan::Error when the device has no kernel for the state's dtype.
  void step(const Kernels& k, float* p, const float* g, const AdamWConfig& c, float lr,
            int64_t step, uint64_t key) {
    step_range(k, p, g, 0, n_, c, lr, step, key);
  }
  // The same for the elements [begin, begin + len) alone (p and g still the whole arrays): the
  // same bits as those elements get from step() (optimizer.early_step_in_backward updates unit
  // by unit).
  void step_range(const Kernels& k, float* p, const float* g, int64_t begin, int64_t len,
                  const AdamWConfig& c, float lr, int64_t step, uint64_t key);

 private:
  DType dtype_ = DType::F32;
  int64_t n_ = 0;
  Buffer<uint8_t> m_, v_;
};

// optimizer.state_dtype's spelling ("float32", "bfloat16") to its dtype; throws titan::Error for
// another.
DType state_dtype(const std::string& name);

}  // namespace titan::optim
