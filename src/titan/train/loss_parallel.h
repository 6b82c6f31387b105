// Vocab-parallel lm_head + cross-entropy (torchtitan's loss parallelism under tensor
// parallelism): the lm_head weight is split by rows over the P ranks of a TP group, rank r
// holding vocabulary rows [v0, v0 + Vr) of w[V, D]; every rank has the same h[T, D] and labels.
// No rank ever holds a full row of logits. Per chunk of at most chunk_rows tokens:
//
//   z_r[t]   = h[t] · w_rᵀ                               (this rank's logits, [n, Vr])
//   m[t]     = max over ranks of max_j z_r[t, j]          (all-reduce max)
//   S[t]     = Σ over ranks of Σ_j exp(z_r[t, j] − m[t])  (all-reduce sum)
//   zt[t]    = the target's logit, from the rank whose rows hold label[t]   (all-reduce sum)
//   ce[t]    = m[t] + log S[t] − zt[t]                    for label[t] != -100
// returns Σ_t ce[t] (double) and the count of valid labels, the same on every rank. With
// grad_scale != 0 (1 / valid tokens of the step), the backward of that loss:
//   g_r[t]   = grad_scale · (exp(z_r[t] − m[t]) / S[t] − onehot_r(label[t]))   (0 for -100 rows)
//   dh[t]    = Σ over ranks of g_r[t] · w_r   (written; all-reduce sum: h's gradient is whole)
//   dw_r    += g_rᵀ · h                       (this rank's rows only; dw_r may be null)
//
// The same loss and gradients as ops::lm_head_ce over the whole weight (ops/loss.h), up to the
// order of the sums (log-sum-exp pieces added over ranks). Communication per chunk: three
// all-reduces of n floats and one of n·D (the input gradient). fp32; every rank of the group
// calls it with the same T, labels and chunk_rows.
#pragma once
#include <cstdint>

#include "titan/dist/communicator.h"
#include "titan/ops/loss.h"

namespace titan::train {

// Vocabulary rows of rank r when V rows are split over P ranks as torch's Shard(0) splits them
// (chunks of ceil(V / P), the last ones shorter or empty): [begin, begin + rows).
struct VocabShard {
  int64_t begin = 0, rows = 0;
};
VocabShard vocab_shard(int64_t V, int rank, int P);

// scratch: chunk_rows·Vr + 3·chunk_rows floats.
int64_t lm_head_ce_vocab_parallel_scratch(int64_t T, int64_t V_local, int64_t chunk_rows);

ops::LossSum lm_head_ce_vocab_parallel(const float* h, const float* w_local, VocabShard shard,
                                       int64_t V, const int32_t* labels, int64_t T, int64_t D,
                                       int64_t chunk_rows, float grad_scale, float* dh,
                                       float* dw_local, float* scratch, dist::Communicator& tp);

}  // namespace titan::train
