// titan check-kernel: for every op an override puts in place of a built-in one, run the replaced
// and the replacing implementation on the shapes the configured model uses plus edge shapes,
// forward and backward, on fp32 inputs and on bf16-representable inputs, and print the max
// absolute and max relative difference per output. For an MoE model, every grouped-experts op the
// model uses (built-in or overridden) is also checked against the reference loop
// ("grouped_experts_reference"), each output within 1e-5 of the reference's largest value.
#pragma once
#include "titan/config/job_config.h"

namespace titan::train {

// Returns false when any difference exceeds the tolerance (RoPE: `tolerance`, default 0, bitwise,
// on fp32 and on bf16 inputs as both compute in fp32; experts: 1e-5 relative) or when nothing was
// checked.
bool check_kernels(const config::JobConfig& cfg, double tolerance = 0.0);

}  // namespace titan::train
