// Context parallelism in the trainer (torchtitan's context_parallel_degree; what the model sees:
// models/context_parallel.h): the cp group's collectives handed to the model as its CpHooks, and
// the head-tail split of the rows every rank of the group reads alike.
//
// Volume per layer and microbatch (P ranks, B rows of S tokens, W = 2·kv_heads·head_dim floats
// of k|v per token): the forward all-gathers k|v ((P−1)/P·B·S·W·4 bytes sent per rank); the
// backward gathers them again and reduce-scatters dk|dv (the same each). Activation
// checkpointing repeats the forward's gather for what it recomputes.
#pragma once
#include <cstdint>
#include <vector>

#include "titan/dist/communicator.h"
#include "titan/models/context_parallel.h"

namespace titan::parallel {

class ContextParallel final : public models::CpHooks {
 public:
  explicit ContextParallel(dist::Communicator& cp) : cp_(cp) {}
  void all_gather(const float* in, float* out, int64_t n) override;
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  void all_reduce_f64(double* x, int64_t n) override;
  double seconds() const { return seconds_; }  // in the collectives, since construction
  models::CpSlice slice() const { return {cp_.rank(), cp_.size()}; }

 private:
  dist::Communicator& cp_;
  std::vector<int64_t> counts_;
  double seconds_ = 0;
};

// The bytes one step of `microbatches` microbatches sends per rank in theory (the volume above)
// for `layers` blocks of W floats of k|v per token (this rank's kv heads), rows of B × S tokens;
// full_ac: the backward's recompute gathers once more.
double context_parallel_theory_bytes(int64_t P, int64_t layers, int64_t W, int64_t B, int64_t S,
                                     int64_t microbatches, bool full_ac);

// local[B, S/P] ← this rank's chunks of full[B, S] (rows of S values): chunk r then chunk
// 2P − 1 − r of each row, chunks of S / (2P).
void split_rows(const int32_t* full, int64_t B, int64_t S, const models::CpSlice& slice,
                int32_t* local);

}  // namespace titan::parallel
