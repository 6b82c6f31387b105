#include "titan/models/module_types.h"

namespace titan::models {

void register_decoder_module_types(plugin::Host& host) {
  host.add_module_type({"ModuleList", {}, {}});
  host.add_module_type({"TransformerBlock.Config", {}, {}});
  host.add_module_type({"Attention.Config", {}, {}});
  host.add_module_type({"FeedForward.Config", {}, {}});
  host.add_module_type(
      {"RoPE.Config", {}, {{"op", ""}, {"theta", "1000000"}, {"max_seq_len", "0"}}});
  host.add_module_type({"CosSinRoPE.Config",
                        {"RoPE.Config"},
                        {{"op", "cos_sin_rope"}, {"theta", "1000000"}, {"max_seq_len", "0"}}});
  // MoE: layers.N.moe (MoE.Config) . router (TokenChoiceTopKRouter.Config),
  //      . experts (GroupedExperts.Config: op, num_experts, top_k, dim, hidden_dim)
  host.add_module_type({"MoE.Config", {}, {}});
  host.add_module_type(
      {"TokenChoiceTopKRouter.Config", {}, {{"num_experts", "0"}, {"top_k", "0"}}});
  host.add_module_type(
      {"Experts.Config",
       {},
       {{"op", ""}, {"num_experts", "0"}, {"top_k", "0"}, {"dim", "0"}, {"hidden_dim", "0"}}});
  host.add_module_type({"GroupedExperts.Config",
                        {"Experts.Config"},
                        {{"op", "grouped_experts"},
                         {"num_experts", "0"},
                         {"top_k", "0"},
                         {"dim", "0"},
                         {"hidden_dim", "0"}}});
}

}  // namespace titan::models
