// Vocab-parallel lm_head + cross-entropy over a Communicator (torchtitan's loss parallelism):
// ops::lm_head_ce_vocab_parallel (ops/loss.h states the maths) with the group's reductions, and
// h's gradient all-reduced so that it is whole on every rank. The model under tensor parallelism
// calls the ops function itself through its TpHooks (reduce-scattering dh under sequence
// parallelism); this form is for callers that hold a group.
#pragma once
#include <cstdint>

#include "titan/dist/communicator.h"
#include "titan/models/tensor_parallel.h"
#include "titan/ops/loss.h"

namespace titan::parallel {

using VocabShard = models::ShardRange;
inline VocabShard vocab_shard(int64_t V, int rank, int P) {
  return models::shard_range(V, rank, P);
}

// scratch: lm_head_ce_vocab_parallel_scratch floats (fp32).
int64_t lm_head_ce_vocab_parallel_scratch(int64_t T, int64_t V_local, int64_t chunk_rows);

ops::LossSum lm_head_ce_vocab_parallel(const float* h, const float* w_local, VocabShard shard,
                                       int64_t V, const int32_t* labels, int64_t T, int64_t D,
                                       int64_t chunk_rows, float grad_scale, float* dh,
                                       float* dw_local, float* scratch, dist::Communicator& tp);

}  // namespace titan::parallel
