// The per-process memory plan (titan plan, and the check titan train makes before allocating):
// what the configured run holds, line by line, from the model's parameter list and size table
// (a plan-only model: nothing is allocated to make it), per rank of the parallel layout: FSDP
// shards, and the tensor/expert-parallel slices of torchtitan's sharding plan (the placements the
// model declares: ParamInfo::tp, TensorSize::tp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/dist/parallel_dims.h"
#include "titan/models/model.h"

namespace titan::tools {

struct MemoryPlan {
  struct Line {
    std::string what;
    int64_t bytes = 0;
  };
  std::vector<Line> lines;
  std::string layout = "single process";  // ParallelDims::describe()
  // training.device: off the CPU the lines are the device's memory, planned against its size
  // (capacity 0: it cannot be queried here, e.g. no GPU visible; the CPU's is the machine's).
  std::string device = "cpu";
  int64_t capacity = 0;
  int64_t total() const;
  // One line per entry and the total, in GiB, with the machine's (or device's) memory.
  std::string format() const;
};

// The plan of `titan train` for cfg, from a plan-only model of it (models::BuildOptions::allocate
// false) or, in the first form, one built here for the layout of cfg's degrees
// (ParallelDims::for_plan). Counts the GEMM probe that runs at start when metrics.peak_flops is
// 0, and the process's resident memory now (code, libraries, data).
//
// Per rank: a column- or row-wise parameter holds 1/tp, experts 1/ep (without EP 1/tp), then
// FSDP keeps 1/fsdp of that (experts under EP: 1/efsdp) as master weights, reduced gradient and
// AdamW state; activations divide by tp where the model marks them (heads and hidden units
// always, the residual stream with sequence parallelism, the logits chunk with loss
// parallelism); the gathered inputs of the projections and the MoE tensors are counted whole
// (an upper bound: routed tokens per rank vary with the routing).
MemoryPlan plan_memory(const config::JobConfig& cfg);
MemoryPlan plan_memory(const config::JobConfig& cfg, const models::Model& plan_model,
                       const dist::ParallelDims& dims = {});

// Throws titan::Error (one line: the plan's total, the machine's or device's memory, what to
// change) when the plan exceeds it.
void check_fits(const MemoryPlan& plan);

}  // namespace titan::tools
