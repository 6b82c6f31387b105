#include "titan/optim/state.h"

#include "titan/core/error.h"
#include "titan/optim/adamw_math.h"

namespace titan::optim {

AdamWState::AdamWState(DType dtype, int64_t n, const DeviceMemory& mem) : dtype_(dtype), n_(n) {
  check(
      dtype == DType::F32 || dtype == DType::BF16,
      std::string("AdamW moments are stored in float32 or bfloat16, not ") + dtype_op_name(dtype));
  const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
  m_.resize(bytes, mem);
  v_.resize(bytes, mem);
}

void AdamWState::step_range(const Kernels& k, float* p, const float* g, int64_t begin, int64_t len,
                            const AdamWConfig& c, float lr, int64_t step, uint64_t key) {
  check(begin >= 0 && len >= 0 && begin + len <= n_, "AdamWState::step_range out of range");
  p += begin;
  g += begin;
  if (dtype_ == DType::F32) {
    k.adamw_step(p, g, static_cast<float*>(m()) + begin, static_cast<float*>(v()) + begin, len, c,
                 lr, step);
    return;
  }
  check(k.adamw_step_bf16 != nullptr,
        "optimizer.state_dtype bfloat16: device " + k.device +
            " has no AdamW kernel for bfloat16 moments; use optimizer.state_dtype float32");
  // The rounding bits of element i hash key + i·φ (optim/adamw_math.h sr_bits): shifting the key
  // by begin·φ gives the range the bits its elements have in the whole array.
  k.adamw_step_bf16(p, g, static_cast<uint16_t*>(m()) + begin, static_cast<uint16_t*>(v()) + begin,
                    len, c, lr, step, key + static_cast<uint64_t>(begin) * kGoldenGamma);
}

DType state_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  throw Error("optimizer.state_dtype '" + name + "' must be float32 or bfloat16");
}

}  // namespace titan::optim
