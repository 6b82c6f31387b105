// The Qwen3 model's module config tree (what overrides rewrite) and the ops it resolves to (the
// tree's node types: models/module_types.h, plus the root Qwen3Model.Config registered here):
//   model (Qwen3Model.Config)
//     layers (ModuleList) . {i} (TransformerBlock.Config)
//       attention (Attention.Config) . rope (CosSinRoPE.Config: op, theta, max_seq_len)
//       feed_forward (FeedForward.Config)                     dense layers
//       moe (MoE.Config) . router (TokenChoiceTopKRouter.Config)  MoE layers
//                        . experts (GroupedExperts.Config: op, num_experts, top_k, dim,
//                                   hidden_dim)
#pragma once
#include <memory>
#include <vector>

#include "titan/config/module_tree.h"
#include "titan/core/dtype.h"
#include "titan/models/qwen3/args.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/rope_op.h"
#include "titan/plugin/registry.h"

namespace titan::qwen3 {

void register_module_types(plugin::Host& host);

std::shared_ptr<config::ModuleNode> build_module_tree(const Qwen3Args& a, int64_t seq_len);

// The RoPE op of every layer, looked up by each rope node's "op" field under (device, float32);
// runs each op's check on seq_len (once per distinct op).
std::vector<ops::RopeOp> rope_plan(config::ModuleNode& root, const Qwen3Args& a, int64_t seq_len,
                                   const plugin::Registry& reg = plugin::Registry::global(),
                                   const std::string& device = "cpu");

// The grouped-experts op of every layer (empty entries for dense layers; an empty vector for a
// dense model), from each experts node's "op" field, registered for <device>/<compute dtype>; runs
// each op's check once on the layer shape for `tokens` tokens per microbatch. An op with no
// bfloat16 kernel runs its float32 one on the fp32 master weights in a bf16 run (logged once per
// op when `log`).
std::vector<ops::GroupedExpertsOp> experts_plan(
    config::ModuleNode& root, const Qwen3Args& a, int64_t tokens, DType compute = DType::F32,
    bool log = false, const plugin::Registry& reg = plugin::Registry::global(),
    const std::string& device = "cpu");

}  // namespace titan::qwen3
