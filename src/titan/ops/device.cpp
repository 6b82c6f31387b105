#include "titan/ops/device.h"

#ifdef TITAN_HAVE_CUDA
#include "titan/ops/cuda/cuda_ops.h"
#endif

namespace titan::ops {

#ifdef TITAN_HAVE_CUDA
bool cuda_built() { return true; }
bool cuda_usable(std::string* why) { return cuda::device_count(why) > 0; }
std::string cuda_device() { return cuda::describe_device(); }
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
#endif

}  // namespace titan::ops
