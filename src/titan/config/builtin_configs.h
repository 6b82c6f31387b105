// The built-in config functions: qwen3_debugmodel and one per dense flavor.
#pragma once

namespace titan::config {
void register_builtin_configs();
}
