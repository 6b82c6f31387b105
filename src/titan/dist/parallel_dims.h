// torchtitan's ParallelDims: the parallel layout from parallelism.* and the number of ranks, and
// the groups (meshes) derived from it. Ranks form the grid [dp_replicate, dp_shard, tp] (row-major,
// torchtitan's mesh order); implemented here: data parallelism in its three forms
//   DDP   dp_replicate = N, dp_shard = 1     gradients all-reduced, every rank a full replica
//   FSDP  dp_shard = N                        gradients reduce-scattered, AdamW state sharded
//   HSDP  dp_replicate × dp_shard             sharded within a replica group, all-reduced across
//   EP    ep ranks of the [dp_shard, tp]     MoE experts split over them (each rank holds
//         grid (whole tp groups)             its own), tokens dispatched (train/expert_parallel.h);
//                                            the experts FSDP-sharded over efsdp
//   TP    tp consecutive ranks                dense Qwen3's projections split over them (with
//                                            sequence and loss parallelism), the same data read
//                                            by all (train/tensor_parallel.h); FSDP/HSDP/DDP
//                                            over the ranks of the same tp rank
//   CP    cp ranks of the [dp_shard, cp] grid  each microbatch row's sequence split over them
//                                            (head-tail chunks, models/context_parallel.h), the
//                                            same data read by all; FSDP over dp_shard·cp
//                                            (torchtitan's dp_shard_cp mesh)
// Pipeline parallelism is validated as torchtitan does; training refuses it with one line while
// it is not implemented.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "titan/config/job_config.h"
#include "titan/dist/communicator.h"

namespace titan::dist {

struct ParallelDims {
  int64_t dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, pp = 1, ep = 1, world = 1;
  bool sp = false;             // sequence parallelism (tp > 1 and enable_sequence_parallel)
  bool loss_parallel = false;  // vocab-parallel loss (tp > 1 and not disable_loss_parallel)

  // Validates cfg.parallelism against world_size with torchtitan's rules and words
  // (dp_shard -1 = world / (dp_replicate·cp·tp·pp); the product must equal the world size;
  // (dp_shard·cp·tp) % ep == 0). Throws titan::Error naming the field.
  static ParallelDims layout(const config::JobConfig& cfg, int64_t world_size);
  // The layout of the degrees as given, for a plan made in one process (dp_shard -1 as 1).
  static ParallelDims for_plan(const config::JobConfig& cfg);
  // layout(), then refuses the degrees training does not implement yet.
  static ParallelDims from_config(const config::JobConfig& cfg, int64_t world_size);

  int64_t batch() const { return dp_replicate * dp_shard; }  // ranks that read different data
  // FSDP: the weights sharded over dp_shard·cp ranks (under CP even with dp_shard 1).
  bool sharded() const { return fsdp() > 1; }
  int64_t fsdp() const { return dp_shard * cp; }  // the ranks sharing one replica's shards
  // The ranks sharing one expert's shards (torchtitan's efsdp mesh; EP borrows from
  // dp_shard·cp·tp).
  int64_t efsdp() const { return dp_shard * cp * tp / ep; }
  // "FSDP 4", "DDP 2", "HSDP 2x2", "FSDP 2 x TP 2 (SP)", "FSDP 8 x EP 8", "single process".
  std::string describe() const;
};

// The groups of one rank in the layout: `batch` (every data-parallel rank and, under CP, the
// ranks holding the other chunks of its rows: token counts, loss), `fsdp` (the ranks sharing one
// replica's shards: dp_shard·cp) and `replicate` (the ranks holding the same shard in different
// replicas). batch_rank: which data this rank reads (its index among dp_replicate·dp_shard).
struct Meshes {
  // ep: the expert-parallel group (ep consecutive ranks of the replica's [dp_shard, tp] grid; a
  // group of one without EP).
  // tp: the tensor-parallel group (tp consecutive ranks, reading the same data; a group of one
  // without TP). batch, fsdp and replicate join the ranks of the same tp_rank.
  // efsdp: the ranks sharding the same experts under EP (torchtitan's efsdp mesh:
  // dp_shard·tp/ep ranks, the same place in their ep groups); unused without EP.
  // cp: the ranks holding the chunks of the same rows (cp consecutive data indices of the
  // [dp_shard, cp] grid at the same tp rank; a group of one without CP).
  std::unique_ptr<Communicator> batch, fsdp, replicate, ep, tp, efsdp, cp;
  int64_t batch_rank = 0, fsdp_rank = 0, replicate_rank = 0, tp_rank = 0, cp_rank = 0;
};
Meshes make_meshes(const ParallelDims& d, Communicator& world);

}  // namespace titan::dist
