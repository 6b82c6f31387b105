// Tensor parallelism as the model sees it (torchtitan's parallelize_module with the Qwen3 plan,
// models/qwen3/sharding.py): the model is built for one slice of the layout (TpSlice) and calls
// TpHooks at the plan's redistribution points; the trainer implements the hooks over its tp group
// (train/tensor_parallel.h), so the model never sees a rank's communicator.
//
// Slices (torch's Shard placements, chunks of ceil(n / P), the last ones shorter or empty):
//   column-wise (dim 0): wq, wk, wv (whole heads), w1, w3 (hidden units), tok_embeddings and
//                        lm_head (vocabulary rows);
//   row-wise (dim 1):    wo, w2;
//   replicated:          the norms, q_norm and k_norm.
// Sequence parallelism shards the residual stream, the norms and the adds over the tokens of the
// microbatch (rank r: flattened token rows [r·T/P, (r+1)·T/P)).
#pragma once
#include <algorithm>
#include <cstdint>

namespace titan::models {

// Rows [begin, begin + rows) of n split over P ranks as torch's Shard chunks them.
struct ShardRange {
  int64_t begin = 0, rows = 0;
};
inline ShardRange shard_range(int64_t n, int rank, int P) {
  const int64_t chunk = (n + P - 1) / P;
  const int64_t begin = std::min(n, chunk * rank);
  return {begin, std::min(n, begin + chunk) - begin};
}

struct TpSlice {
  int rank = 0, size = 1;
  bool sequence_parallel = false;
  bool active() const { return size > 1; }
  // Expert parallelism (torchtitan's ExpertParallel, expert_tensor_parallel_degree 1): the routed
  // experts of every MoE layer split over ep_size ranks, rank ep_rank holding experts
  // [ep_rank·E/ep_size, (ep_rank+1)·E/ep_size) whole (not split over tp); the trainer's dispatch
  // (train/expert_parallel.h) brings them their tokens.
  int ep_rank = 0, ep_size = 1;
  bool ep_active() const { return ep_size > 1; }

  // What a model asks of its slice (it never reads the ranks themselves): the rows of a
  // dimension of n it holds, split over the tp ranks or (whole experts) the ep ranks; the block
  // of T/size rows of T it routes when every rank holds all T; whether it adds the terms a
  // partial sum over the group must count once.
  ShardRange tp_shard(int64_t n) const { return shard_range(n, rank, size); }
  ShardRange ep_shard(int64_t n) const { return shard_range(n, ep_rank, ep_size); }
  ShardRange token_block(int64_t T) const { return {rank * (T / size), T / size}; }
  bool counts_replicated_terms() const { return rank == 0; }
};

// The collectives of the tp group, in the model's words. Every rank of the group calls them in
// the same order with the same sizes. The float buffers are the model's memory (a device's off
// the CPU); all_reduce_f64's are host memory (statistics).
class TpHooks {
 public:
  virtual ~TpHooks() = default;
  // x[0:n] summed (or maxed) over the group, in place.
  virtual void all_reduce(float* x, int64_t n) = 0;
  virtual void all_reduce_max(float* x, int64_t n) = 0;
  virtual void all_reduce_f64(double* x, int64_t n) = 0;
  // out[P·n] ← every rank's in[n], in rank order.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  // out[n] ← Σ over ranks of their in[rank·n, (rank+1)·n) (in: P·n values).
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
};

}  // namespace titan::models
