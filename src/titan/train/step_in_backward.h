// torchtitan's optimizer.early_step_in_backward. For a model whose parameters are not sharded
// (one process, DDP, tensor parallelism) it is installed as the model's ParamHooks and applies
// each unit's AdamW update as soon as the backward has finished that unit's gradient
// (grads_ready), then gives the gradient back (zeroed, its pages returned to the OS), so the
// whole-model gradient never exists: at most the unit being computed, and from the head's
// forward on the embedding's (a tied lm_head's gradient lands there). Under FSDP/HSDP
// (parallel/fsdp.h holds the hooks) the trainer calls shard_ready for this rank's block of each
// unit as soon as its reduce-scatter has completed, on the master and gradient shards.
//
// Per unit, in the order the backward completes them (the head, the layers from the last, the
// embedding): all-reduced over the replicas (DDP, HSDP), Σg² counted for the logged norm,
// updated, freed. What cannot carry over from the step-at-the-end:
//   clipping: the global norm is known only after every unit was updated, so training.max_norm
//     is not applied (torchtitan's optimizer-in-backward skips it too); the norm is still
//     measured before the updates and logged;
//   gradient accumulation: a unit would be updated after each microbatch (refused);
//   a non-finite gradient: the units completed before it were already updated; the unit with
//     it and every later one are left as they were (the trainer then stops, saying so).
#pragma once
#include <cstdint>
#include <vector>

#include "titan/dist/communicator.h"
#include "titan/models/model.h"
#include "titan/optim/kernels.h"
#include "titan/optim/state.h"

namespace titan::train {

// Adds to sq the Σg² of g[begin, end): sq[0] of the elements outside the `replicated` ranges
// (sorted, in g's coordinates), sq[1] of those inside (a tensor-parallel norm counts them once).
void add_sum_squares(const optim::Kernels& k, const float* g, int64_t begin, int64_t end,
                     const std::vector<models::FlatRange>& replicated, double sq[2]);

class StepInBackward final : public models::ParamHooks {
 public:
  // replicate: the group the gradients are all-reduced over (null or one rank: none);
  // replicated: the ranges a tensor-parallel norm counts once (Trainer::find_replicated).
  StepInBackward(models::ParamStore& store, optim::AdamWState& state, const optim::Kernels& k,
                 const optim::AdamWConfig& c, dist::Communicator* replicate,
                 std::vector<models::FlatRange> replicated);

  // The update every unit of the coming backward gets: its learning rate, the step number (from
  // 1) and the rounding keys of the bf16 moments and of the bf16 master weights
  // (ParamStore::update_end).
  void begin_step(float lr, int64_t step, uint64_t key, uint64_t weight_key);
  uint64_t weight_key() const { return weight_key_; }
  // After the backward: this rank's Σg² of its not-replicated and replicated elements, and how
  // many units were updated (all of them unless a gradient was not finite).
  const double* sum_squares() const { return sq_; }
  int64_t units_updated() const { return updated_; }
  bool failed() const { return failed_; }

  void begin_pass(bool backward_follows) override {
    backward_follows_ = backward_follows;
    head_seen_ = false;
  }
  void acquire(int64_t u, bool backward) override;
  bool release(int64_t, bool) override { return false; }
  void grads_ready(int64_t u) override;
  // FSDP: elements [at, at + len) of this rank's shard (p the masters, g the reduced gradients),
  // a unit's block whose reduce-scatter has completed.
  void shard_ready(float* p, float* g, int64_t at, int64_t len);

 private:
  // Reduce over the replicas, count, update [at, at + len) of p from g; false (nothing updated)
  // once a gradient was not finite.
  bool apply(float* p, float* g, int64_t at, int64_t len);

  models::ParamStore& store_;
  optim::AdamWState& state_;
  const optim::Kernels& k_;
  const optim::AdamWConfig& c_;
  dist::Communicator* replicate_;
  std::vector<models::FlatRange> replicated_;
  float lr_ = 0;
  int64_t step_ = 0, updated_ = 0;
  uint64_t key_ = 0, weight_key_ = 0;
  double sq_[2] = {0, 0};
  bool backward_follows_ = false, head_seen_ = false, failed_ = false;
};

}  // namespace titan::train
