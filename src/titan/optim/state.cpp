#include "titan/optim/state.h"

#include "titan/core/error.h"

namespace titan::optim {

AdamWState::AdamWState(DType dtype, int64_t n, const DeviceMemory& mem) : dtype_(dtype), n_(n) {
  check(
      dtype == DType::F32 || dtype == DType::BF16,
      std::string("AdamW moments are stored in float32 or bfloat16, not ") + dtype_op_name(dtype));
  const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
  m_.resize(bytes, mem);
  v_.resize(bytes, mem);
}

void AdamWState::step(const Kernels& k, float* p, const float* g, const AdamWConfig& c, float lr,
                      int64_t step, uint64_t key) {
  if (dtype_ == DType::F32) {
    k.adamw_step(p, g, static_cast<float*>(m()), static_cast<float*>(v()), n_, c, lr, step);
    return;
  }
  check(k.adamw_step_bf16 != nullptr,
        "optimizer.state_dtype bfloat16: device " + k.device +
            " has no AdamW kernel for bfloat16 moments; use optimizer.state_dtype float32");
  k.adamw_step_bf16(p, g, static_cast<uint16_t*>(m()), static_cast<uint16_t*>(v()), n_, c, lr, step,
                    key);
}

DType state_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  throw Error("optimizer.state_dtype '" + name + "' must be float32 or bfloat16");
}

}  // namespace titan::optim
