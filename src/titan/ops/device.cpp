#include "titan/ops/device.h"

#include "titan/core/error.h"
#include "titan/ops/backend.h"
#ifdef TITAN_HAVE_CUDA
#include "titan/ops/cuda/cuda_ops.h"
#endif

namespace titan::ops {

#ifdef TITAN_HAVE_CUDA
bool cuda_built() { return true; }
bool cuda_usable(std::string* why) { return cuda::device_count(why) > 0; }
std::string cuda_device() { return cuda::describe_device(); }
void select_cuda_device(int index) { cuda::set_device(index); }
bool device_memory(const std::string& device, int64_t* total, int64_t* used) {
  if (device != "cuda" || cuda::device_count(nullptr) == 0) return false;
  cuda::memory_info(total, used);
  return true;
}
double device_gemm_flops(const std::string& device, bool bf16) {
  return device == "cuda" ? cuda::gemm_probe_flops(bf16) : 0.0;
}
#else
bool cuda_built() { return false; }
bool cuda_usable(std::string* why) {
  if (why)
    *why =
        "this titan was built without CUDA (CMake found no nvcc, or -DTITAN_CUDA=OFF); install "
        "the CUDA toolkit and rebuild";
  return false;
}
std::string cuda_device() { return ""; }
void select_cuda_device(int) {}
bool device_memory(const std::string&, int64_t*, int64_t*) { return false; }
double device_gemm_flops(const std::string&, bool) { return 0.0; }
#endif

void check_device(const std::string& device) {
  if (device == "cuda") {
    std::string why;
    const bool usable = ops::cuda_usable(&why);
    check(usable, "training.device cuda: " + why);
  } else if (device != "cpu") {  // another device: one with a registered backend
    std::string devices;
    bool known = false;
    for (const std::string& b : ops::registered_backends()) {
      const std::string d = b.substr(0, b.find('/'));
      known |= d == device;
      if (devices.find(d) == std::string::npos) devices += (devices.empty() ? "" : ", ") + d;
    }
    check(known, "training.device '" + device + "' is not a known device; use cpu or cuda (" +
                     "devices with kernels here: " + devices + ")");
  }
}

}  // namespace titan::ops
