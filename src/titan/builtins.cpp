// The one place that registers everything titan has built in: module config types of every
// model, the device records, the ops of every backend and the collectives of every device.
// Adding a model or a backend adds one line here; a device, one record.
#include "titan/dist/device_group.h"
#include "titan/dist/nccl/nccl_group.h"
#include "titan/models/module_types.h"
#include "titan/models/qwen3/modules.h"
#include "titan/ops/backend.h"
#include "titan/ops/device.h"
#ifdef TITAN_HAVE_CUDA
#include "titan/ops/cuda/cuda_ops.h"
#endif
#include "titan/ops/elementwise.h"
#ifdef TITAN_HAVE_CUDA
#include "titan/optim/cuda/adamw.h"
#endif
#include "titan/ops/experts_op.h"
#include "titan/optim/kernels.h"
#include "titan/plugin/registry.h"

namespace titan::ops {

namespace {

Device cpu_device() {
  Device d;
  d.name = "cpu";
  d.host = true;
  d.usable = [](std::string*) { return true; };
  return d;
}

// CUDA: a record in every build, so that asking for it says what is missing.
Device cuda_device() {
  Device d;
  d.name = "cuda";
#ifdef TITAN_HAVE_CUDA
  d.usable = [](std::string* why) { return cuda::device_count(why) > 0; };
  d.describe = [] { return cuda::describe_device(); };
  d.precision = [](bool bf16) {
    return std::string("weights, gradients, activations and AdamW state in GPU memory; ") +
           (bf16 ? "bf16 GEMM inputs (cuBLASLt), fp32 accumulation and master weights"
                 : "float32 throughout (cuBLASLt, no TF32)");
  };
  d.select = [](int index) { cuda::set_device(index); };
  d.memory = [](int64_t* total, int64_t* used) {
    if (cuda::device_count(nullptr) == 0) return false;
    cuda::memory_info(total, used);
    return true;
  };
  d.gemm_flops = [](bool bf16) { return cuda::gemm_probe_flops(bf16); };
#else
  d.usable = [](std::string* why) {
    if (why)
      *why =
          "this titan was built without CUDA (CMake found no nvcc, or -DTITAN_CUDA=OFF); install "
          "the CUDA toolkit and rebuild";
    return false;
  };
#endif
  d.no_collectives =
      "this titan was built without NCCL (CMake found no nccl.h and libnccl beside the CUDA "
      "toolkit); install NCCL and rebuild, or train in one process";
  d.granule = int64_t{2} << 20;
  d.runtime_memory = {"CUDA context, kernels, cuBLASLt workspace (estimate)", int64_t{600} << 20};
  d.probe_memory = [](bool bf16) {
    return std::pair<std::string, int64_t>{
        bf16 ? "GEMM probe at start (8192^2: 2 bf16 + 1 fp32, freed)"
             : "GEMM probe at start (3 x 8192^2 fp32, freed)",
        (bf16 ? 8 : 12) * int64_t{8192} * 8192};
  };
  return d;
}

}  // namespace

// The device records (ops/device.h), registered before the first lookup.
std::vector<Device> builtin_devices() { return {cpu_device(), cuda_device()}; }

// The backend tables (ops/backend.h), registered before the first lookup.
std::vector<Backend> builtin_backends() {
#ifdef TITAN_HAVE_CUDA
  return {cpu_backend(), cpu_bf16_backend(), cuda::backend(false), cuda::backend(true)};
#else
  return {cpu_backend(), cpu_bf16_backend()};
#endif
}

}  // namespace titan::ops

namespace titan::optim {

// The optimizer's kernels per device (optim/kernels.h).
std::vector<Kernels> builtin_kernels() {
  std::vector<Kernels> k{
      {"cpu", &adamw_step, &sum_squares, &clip_by_norm, &adamw_step_bf16, &adamw_step_q8}};
#ifdef TITAN_HAVE_CUDA
  k.push_back({"cuda", &cuda::adamw_step, &cuda::sum_squares, &cuda::clip_by_norm,
               &cuda::adamw_step_bf16, &cuda::adamw_step_q8});
#endif
  return k;
}

}  // namespace titan::optim

namespace titan::dist {

// The collectives over each device's memory (dist/device_group.h).
std::vector<std::pair<std::string, DeviceGroupFactory>> builtin_device_groups() {
  std::vector<std::pair<std::string, DeviceGroupFactory>> g;
  if (nccl_built()) g.emplace_back("cuda", &nccl_group);
  return g;
}

}  // namespace titan::dist

namespace titan::plugin {

void register_builtins(Registry& reg) {
  reg.origin_ = "titan";
  models::register_decoder_module_types(reg);
  qwen3::register_module_types(reg);
  reg.add_op(ops::cos_sin_rope_op());
  reg.add_op(ops::grouped_experts_op());
  reg.add_op(ops::grouped_experts_bf16_op());
  reg.add_op(ops::grouped_experts_reference_op());
#ifdef TITAN_HAVE_CUDA
  reg.add_op(ops::cuda::cos_sin_rope_op());
  reg.add_op(ops::cuda::grouped_experts_op(false));
  reg.add_op(ops::cuda::grouped_experts_op(true));
#endif
}

Registry& Registry::global() {
  static Registry r;
  static const bool registered = (register_builtins(r), true);
  (void)registered;
  return r;
}

}  // namespace titan::plugin
