// AdamW's state for one rank's shard of the parameters (n elements): the two moments exp_avg (m)
// and exp_avg_sq (v), stored in float32, bfloat16 or 8 bits (optimizer.state_dtype) in a
// device's memory. Bytes per parameter: 8 in float32; 4 in bfloat16 (stochastically rounded on
// each update, optim/adamw_math.h); 2 + 8/256 in int8 (bitsandbytes' block-wise quantization:
// one code byte per element and moment, one fp32 scale per block of 256 elements and moment; a
// block never crosses the start of a parameter).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/dtype.h"
#include "titan/optim/kernels.h"

namespace titan::optim {

class AdamWState {
 public:
  AdamWState() = default;
  // Zeroed moments of n elements. `starts`: where each parameter (or the piece of one a shard
  // holds) begins in [0, n), ascending; the 8-bit blocks start there and every kQ8Block elements
  // after. Throws titan::Error for a dtype other than F32, BF16 and I8 (int8).
  AdamWState(DType dtype, int64_t n, const DeviceMemory& mem,
             const std::vector<int64_t>& starts = {});

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
  // by unit). In int8 the range must start and end at parameter starts (or at n).
  void step_range(const Kernels& k, float* p, const float* g, int64_t begin, int64_t len,
                  const AdamWConfig& c, float lr, int64_t step, uint64_t key);

  // int8 state: elements [at, at + len) of m (first) or v decoded to host fp32, or
  // encoded from fp32 as the update encodes (the range starting and ending at parameter starts
  // or n). decode gives m's code 0, the map's end -0.993, as -1 × the block's scale (the value
  // quantized there), so that encoding what decode gave finds each block's scale and codes
  // again, bit for bit: a checkpoint resumes bitwise.
  void decode(bool first, int64_t at, int64_t len, float* out) const;
  void encode(bool first, int64_t at, int64_t len, const float* in);
  // int8: the blocks' scales of m (first) or v, one per block in element order (device memory).
  float* absmax(bool first) { return (first ? absmax_m_ : absmax_v_).data(); }

 private:
  // The blocks [b0, b1) covering [at, at + len); throws when the range cuts a block.
  std::pair<int64_t, int64_t> blocks_of(int64_t at, int64_t len) const;

  DType dtype_ = DType::F32;
  int64_t n_ = 0;
  Buffer<uint8_t> m_, v_;
  // int8: the scales (absmax) per block of m and v, and the blocks' first elements (nblocks + 1
  // entries, the last n), in the device's memory and on the host.
  Buffer<float> absmax_m_, absmax_v_;
  Buffer<int64_t> begin_;
  std::vector<int64_t> host_begin_;
};

// Throws titan::Error, naming optimizer.state_dtype, when the kernels k lack the update for moments
// in dtype.
void check_kernels_for(const Kernels& k, DType dtype);

// optimizer.state_dtype's spelling ("float32", "bfloat16", "int8") to its dtype (I8 for int8);
// throws titan::Error for another.
DType state_dtype(const std::string& name);

}  // namespace titan::optim
