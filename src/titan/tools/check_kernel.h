// titan check-kernel: for every op an override puts in place of a built-in one, run the replaced
// and the replacing implementation on the shapes the configured model uses plus edge shapes,
// forward and backward, on fp32 inputs and on bf16-representable inputs, and print the max
// absolute and max relative difference per output. For an MoE model, every grouped-experts op the
// model uses (built-in or overridden) is also checked against the reference loop
// ("grouped_experts_reference"), each output within 8·eps·√max(D, 2·K·F) of the reference's
// largest value (fp32 summation error over the longest sum; 1.1e-4 at debugmodel_moe's shape).
// With --training.device D (not cpu), the ops D runs (its built-in ones included, under the same
// names) are compared with the CPU's, their inputs copied to the device and outputs back; an op
// with no kernel for D is one error naming it (the op table's "no ... op named ... for D/...").
#pragma once
#include "titan/config/job_config.h"

namespace titan::tools {

// Returns false when any difference exceeds the tolerance (RoPE: `tolerance`, default 0, bitwise,
// on fp32 and on bf16 inputs as both compute in fp32; experts: as above) or when nothing was
// checked.
bool check_kernels(const config::JobConfig& cfg, double tolerance = 0.0);

}  // namespace titan::tools
