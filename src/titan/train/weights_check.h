// What the messages of a non-finite loss say about the weights.
#pragma once
#include <string>

#include "titan/config/job_config.h"
#include "titan/models/model.h"

namespace titan::train {

using models::describe_nonfinite_weights;  // models/model.h

// Where a run's starting weights come from, for messages: "checkpoint.initial_load_path 'P'",
// "model.hf_assets_path 'D'" or "the seeded random init" (as the checkpointer loads them, a
// resumed checkpoint aside).
std::string initial_weights_source(const config::JobConfig& cfg);

}  // namespace titan::train
