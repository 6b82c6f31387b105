// The module config types that decoder models share (torchtitan's common modules), registered
// once for every model: ModuleList, TransformerBlock, Attention, RoPE / CosSinRoPE, FeedForward,
// MoE, TokenChoiceTopKRouter, Experts / GroupedExperts. A model adds its own root type.
#pragma once
#include "titan/plugin/plugin_api.h"

namespace titan::models {

void register_decoder_module_types(plugin::Host& host);

}  // namespace titan::models
