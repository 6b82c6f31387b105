// The one place that registers everything titan has built in: module config types of every
// model, the ops of every backend and the collectives of every device. Adding a model or a
// backend adds one line here.
#include "titan/dist/device_group.h"
#include "titan/dist/nccl/nccl_group.h"
#include "titan/models/module_types.h"
#include "titan/models/qwen3/modules.h"
#include "titan/ops/backend.h"
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
  std::vector<Kernels> k{{"cpu", &adamw_step, &sum_squares, &clip_by_norm}};
#ifdef TITAN_HAVE_CUDA
  k.push_back({"cuda", &cuda::adamw_step, &cuda::sum_squares, &cuda::clip_by_norm});
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
