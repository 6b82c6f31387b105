// The end-of-run reports of a parallel run: per step and rank, the bytes the collectives sent
// against the ring-algorithm volume of the layout (tensor parallelism's activations, FSDP's and
// the replicas' parameters and gradients), the time in them, and expert parallelism's dispatch.
// Shapes come from the model's declared dimensions (models::Model::dims()).
#pragma once
#include <cstdint>

#include "titan/config/job_config.h"
#include "titan/dist/parallel_dims.h"
#include "titan/models/model.h"
#include "titan/parallel/expert_parallel.h"
#include "titan/parallel/fsdp.h"

namespace titan::train {

// What this process's steps did, summed over them.
struct RunTotals {
  double steps = 0;
  int64_t microbatches = 0;  // per step (gradient accumulation)
  int64_t tp_bytes = 0;      // sent by the tp group's collectives
  double tp_seconds = 0;
  int64_t dp_bytes = 0;  // sent by the FSDP / replica collectives
  int64_t ep_bytes = 0;  // sent by the expert dispatch and combine
  parallel::DispatchSeconds ep_seconds;
  int64_t cp_bytes = 0;  // sent by the cp group's collectives
  double cp_seconds = 0;
};

// Logs the reports that apply to dims (none for one rank); fsdp null when not sharded.
void log_parallel_reports(const config::JobConfig& cfg, const dist::ParallelDims& dims,
                          const models::Model& model, const parallel::Fsdp* fsdp,
                          const RunTotals& r);

}  // namespace titan::train
