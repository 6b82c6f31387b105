// Tensor parallelism's redistribution points, one object per point stating its forward and its
// backward (Megatron-Core's tensor_parallel/mappings.py; torchtitan's PrepareModuleInput /
// RowwiseParallel output layouts). A model calls them where its residual stream meets the
// column-parallel projections (GatherSequence) and where the row-parallel projections hand their
// partial sums back (ReducePartial). On a whole model (a group of one) both are identities.
//
//   GatherSequence  forward:  SP: all-gather the sequence shards  [T/P, D] -> [T, D]
//                             no SP: identity (the stream is replicated)
//                   backward: SP: reduce-scatter the partial gradient [T, D] -> [T/P, D]
//                             no SP: all-reduce it in place
//   ReducePartial   forward:  SP: reduce-scatter the partial sums [T, D] -> [T/P, D]
//                             no SP: all-reduce them in place
//                   backward: SP: all-gather the gradient shards [T/P, D] -> [T, D]
//                             no SP: identity
//
// Each is the other's adjoint: GatherSequence's backward is ReducePartial's forward and the
// reverse. The model never sees the group's communicator, only models::TpHooks.
#pragma once
#include <cstdint>

#include "titan/models/tensor_parallel.h"

namespace titan::models {

// The layout both points share: a tp group (hooks, degree), whether the residual stream is
// sharded over the tokens (sequence parallelism), and the stream's width D.
struct TpRegion {
  TpHooks* hooks = nullptr;
  int size = 1;
  bool sequence_parallel = false;
  int64_t width = 0;
  bool active() const { return size > 1; }
  // The residual stream's tokens held here of a microbatch of T.
  int64_t local_tokens(int64_t T) const { return sequence_parallel ? T / size : T; }
};

class GatherSequence {
 public:
  GatherSequence() = default;
  explicit GatherSequence(const TpRegion& r) : r_(r) {}
  // Where a producer writes this rank's rows before forward: scratch when they are gathered,
  // else out itself.
  float* local(float* out, float* scratch) const { return r_.sequence_parallel ? scratch : out; }
  // out [T, D] ← every rank's local rows (local() of out); nothing to do without SP.
  void forward(const float* local_rows, float* out, int64_t T) const {
    if (r_.sequence_parallel) r_.hooks->all_gather(local_rows, out, r_.local_tokens(T) * r_.width);
  }
  // The partial gradient dy [T, D] of the gathered tensor, summed over the group: the rows held
  // here (in scratch under SP, else dy in place). Returns where they are.
  const float* backward(float* dy, float* scratch, int64_t T) const {
    if (!r_.active()) return dy;
    if (r_.sequence_parallel) {
      r_.hooks->reduce_scatter(dy, scratch, r_.local_tokens(T) * r_.width);
      return scratch;
    }
    r_.hooks->all_reduce(dy, T * r_.width);
    return dy;
  }

 private:
  TpRegion r_;
};

class ReducePartial {
 public:
  ReducePartial() = default;
  explicit ReducePartial(const TpRegion& r) : r_(r) {}
  // The partial sums y [T, D] summed over the group: the rows held here (in scratch under SP,
  // else y in place). Returns where they are.
  const float* forward(float* y, float* scratch, int64_t T) const {
    return GatherSequence(r_).backward(y, scratch, T);
  }
  // The gradient of the rows held here, dy, as the row-parallel projection reads it: all T rows
  // (gathered into scratch under SP, else dy itself).
  const float* backward(const float* dy, float* scratch, int64_t T) const {
    if (!r_.sequence_parallel) return dy;
    r_.hooks->all_gather(dy, scratch, r_.local_tokens(T) * r_.width);
    return scratch;
  }

 private:
  TpRegion r_;
};

}  // namespace titan::models
