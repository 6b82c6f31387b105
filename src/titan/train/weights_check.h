// A cheap scan of a model's weights for NaN and infinity, for the messages of a non-finite loss.
#pragma once
#include <string>

#include "titan/config/job_config.h"
#include "titan/models/model.h"

namespace titan::train {

// "" when every weight is finite, else e.g. "3 non-finite values (the first in 'norm.weight')".
std::string describe_nonfinite_weights(const models::Model& m);

// Where a run's starting weights come from, for messages: "checkpoint.initial_load_path 'P'",
// "model.hf_assets_path 'D'" or "the seeded random init" (as the checkpointer loads them, a
// resumed checkpoint aside).
std::string initial_weights_source(const config::JobConfig& cfg);

}  // namespace titan::train
