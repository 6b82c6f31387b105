// torchtitan's ParallelDims: the parallel layout from parallelism.* and the number of ranks, and
// the groups (meshes) derived from it. Ranks form the grid [dp_replicate, dp_shard] (row-major,
// torchtitan's mesh order); implemented here: data parallelism in its three forms
//   DDP   dp_replicate = N, dp_shard = 1     gradients all-reduced, every rank a full replica
//   FSDP  dp_shard = N                        gradients reduce-scattered, AdamW state sharded
//   HSDP  dp_replicate × dp_shard             sharded within a replica group, all-reduced across
// Tensor, expert, context and pipeline parallelism are validated as torchtitan does and refused
// with one line while they are not implemented.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "titan/config/job_config.h"
#include "titan/dist/communicator.h"

namespace titan::dist {

struct ParallelDims {
  int64_t dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, pp = 1, ep = 1, world = 1;

  // Validates cfg.parallelism against world_size with torchtitan's rules and words
  // (dp_shard -1 = world / (dp_replicate·cp·tp·pp); the product must equal the world size;
  // (dp_shard·cp·tp) % ep == 0), then refuses degrees not implemented yet. Throws titan::Error
  // naming the field.
  static ParallelDims from_config(const config::JobConfig& cfg, int64_t world_size);

  int64_t batch() const { return dp_replicate * dp_shard; }  // ranks that read different data
  bool sharded() const { return dp_shard > 1; }
  // "FSDP 4", "DDP 2", "HSDP 2x2", "single process".
  std::string describe() const;
};

// The groups of one rank in the layout: `batch` (every data-parallel rank: data, token counts,
// loss), `fsdp` (the ranks sharing one replica's shards) and `replicate` (the ranks holding the
// same shard in different replicas).
struct Meshes {
  std::unique_ptr<Communicator> batch, fsdp, replicate;
  int64_t batch_rank = 0, fsdp_rank = 0, replicate_rank = 0;
};
Meshes make_meshes(const ParallelDims& d, Communicator& world);

}  // namespace titan::dist
