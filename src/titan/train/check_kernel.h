// titan check-kernel: for every op an override puts in place of a built-in one, run the replaced
// and the replacing implementation on the shapes the configured model uses plus edge shapes,
// forward and backward, on fp32 inputs and on bf16-representable inputs, and print the max
// absolute and max relative difference per output.
#pragma once
#include "titan/config/job_config.h"

namespace titan::train {

// Returns false when any difference exceeds the tolerance (fp32: 0, bitwise; bf16 inputs: 0 as
// both compute in fp32) or when nothing was replaced.
bool check_kernels(const config::JobConfig& cfg, double tolerance = 0.0);

}  // namespace titan::train
