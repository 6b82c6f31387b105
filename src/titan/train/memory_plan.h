// The per-process memory plan (titan plan, and the check titan train makes before allocating):
// what the configured run holds, line by line, from the model's parameter list and size table
// (a plan-only model: nothing is allocated to make it). Later, per rank of a parallel layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/models/model.h"

namespace titan::train {

struct MemoryPlan {
  struct Line {
    std::string what;
    int64_t bytes = 0;
  };
  std::vector<Line> lines;
  int64_t total() const;
  // One line per entry and the total, in GiB, with the machine's memory.
  std::string format() const;
};

// The plan of `titan train` for cfg, from a plan-only model of it (models::BuildOptions::allocate
// false) or, in the first form, one built here. Counts the GEMM probe that runs at start when
// metrics.peak_flops is 0, and the process's resident memory now (code, libraries, data).
MemoryPlan plan_memory(const config::JobConfig& cfg);
// dp_shard: the FSDP shard degree of the layout (AdamW state and the reduced gradient are held
// for 1/dp_shard of the parameters per rank).
MemoryPlan plan_memory(const config::JobConfig& cfg, const models::Model& plan_model,
                       int64_t dp_shard = 1);

// Throws titan::Error (one line: the plan's total, the machine's memory, what to change) when the
// plan exceeds the machine's memory.
void check_fits(const MemoryPlan& plan);

}  // namespace titan::train
