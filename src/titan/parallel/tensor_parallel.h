// Tensor parallelism in the trainer (torchtitan's TP + SP + loss parallelism for Qwen3; the plan
// and the slices: models/tensor_parallel.h): the tp group's collectives handed to the model as
// its TpHooks, and the passage between a rank's slices and the whole tensors for what needs the
// whole model (checkpoints, Hugging Face weights and exports).
//
// Volume (what Communicator::bytes_sent counts, ring algorithms, P ranks, [T, D] fp32 activations
// of a microbatch, A = (P−1)/P·T·D·4 bytes): with sequence parallelism every block moves two
// all-gathers (attention and FFN inputs) and two reduce-scatters (wo and w2 outputs) of A each in
// the forward, and the same four in the backward (the all-gather's backward is a reduce-scatter
// and the other way round); without it, two all-reduces (2A each) per block and direction. Around
// them: the embedding's reduce-scatter (all-reduce), the final norm's all-gather, the loss's
// reductions of 3 values per token, the replicated norms' weight gradients, MoE layers' routing
// weight gradients; activation
// checkpointing repeats the gathers of what it recomputes. theory_bytes() adds these up.
#pragma once
#include <cstdint>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/core/device.h"
#include "titan/dist/communicator.h"
#include "titan/models/model.h"

namespace titan::parallel {

// The MoE layers of the model, for the volume: how many, top_k routing over `experts`, whether
// EP runs over the tp ranks (the layers then route their own rows: Qwen3Model::moe_local) and
// whether the aux loss is on.
struct TpMoe {
  int64_t layers = 0, top_k = 0, experts = 0;
  bool ep_local = false, aux = false;
  std::vector<bool> is_moe;  // per layer (when layers > 0)
};

class TensorParallel final : public models::TpHooks {
 public:
  // tp: the group (host memory); on a device, data: the same ranks over its memory (the float
  // collectives; dist/device_group.h) and mem its memory functions.
  explicit TensorParallel(dist::Communicator& tp, dist::Communicator* data = nullptr,
                          const DeviceMemory& mem = {})
      : tp_(tp), data_(data ? *data : tp), mem_(mem) {}

  void all_reduce(float* x, int64_t n) override;
  void all_reduce_max(float* x, int64_t n) override;
  void all_reduce_f64(double* x, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n) override;
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  double seconds() const { return seconds_; }  // in the collectives, since construction

  // full_buf (laid out as full.params(), a model built whole) ← the whole tensors of every
  // parameter, from each rank's slices in local_buf (laid out as local.params()); collective
  // over the tp group, and the ep group for the experts split over it (ParamInfo::split_over_ep).
  // Any flat buffer of that layout: weights, gradients, AdamW moments.
  static void gather(dist::Communicator& tp, dist::Communicator& ep, const models::Model& local,
                     const float* local_buf, const models::Model& full, float* full_buf);
  // local_buf ← this rank's slices of full_buf (no communication).
  static void slice(const models::Model& local, float* local_buf, const models::Model& full,
                    const float* full_buf);

  // The persistent buffers (MoE expert_bias: replicated, the same on every rank) from one model
  // into the other's, by name.
  static void copy_buffers(const models::Model& from, const models::Model& to);

  // The bytes one optimizer step of `microbatches` microbatches sends per rank in theory (the
  // sum above) for a model of `layers` blocks, dim D, head_dim d, T tokens per microbatch. MoE
  // layers with split experts add the all-reduce of the routing weights' gradient [T, top_k] in
  // their backward; local ones (EP over the tp ranks) skip the FFN's gather and reduce-scatter
  // under SP and add the reductions of what is partial over the ranks' rows instead (the router
  // weight's gradient, the aux-loss statistics, the expert counts).
  static double theory_bytes(const config::JobConfig& cfg, int64_t P, int64_t layers, int64_t D,
                             int64_t d, int64_t T, int64_t microbatches, const TpMoe& moe = {});

 private:
  const std::vector<int64_t>& counts(int64_t n);  // n for every rank
  dist::Communicator& tp_;
  dist::Communicator& data_;
  DeviceMemory mem_;
  std::vector<int64_t> counts_;
  double seconds_ = 0;
};

}  // namespace titan::parallel
