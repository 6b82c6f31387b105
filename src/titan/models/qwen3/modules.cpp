#include "titan/models/qwen3/modules.h"

#include <set>
#include <sstream>

#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::qwen3 {

void register_module_types(plugin::Host& host) {
  host.add_module_type({"Qwen3Model.Config", {}, {}});
}

std::shared_ptr<config::ModuleNode> build_module_tree(const Qwen3Args& a, int64_t seq_len) {
  auto node = [](const std::string& type) {
    auto n = std::make_shared<config::ModuleNode>();
    n->type = type;
    n->bases = plugin::Registry::global().module_type(type).bases;
    return n;
  };
  auto root = node("Qwen3Model.Config");
  auto layers = node("ModuleList");
  std::ostringstream theta;
  theta.precision(17);
  theta << a.rope_theta;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    auto block = node("TransformerBlock.Config");
    auto attn = node("Attention.Config");
    auto rope = node("CosSinRoPE.Config");
    rope->fields = {
        {"op", "cos_sin_rope"}, {"theta", theta.str()}, {"max_seq_len", std::to_string(seq_len)}};
    attn->children.emplace_back("rope", rope);
    block->children.emplace_back("attention", attn);
    if (a.moe_layer(i)) {
      auto moe = node("MoE.Config");
      auto router = node("TokenChoiceTopKRouter.Config");
      router->fields = {{"num_experts", std::to_string(a.num_experts)},
                        {"top_k", std::to_string(a.top_k)}};
      auto experts = node("GroupedExperts.Config");
      experts->fields = {{"op", "grouped_experts"},
                         {"num_experts", std::to_string(a.num_experts)},
                         {"top_k", std::to_string(a.top_k)},
                         {"dim", std::to_string(a.dim)},
                         {"hidden_dim", std::to_string(a.moe_hidden_dim)}};
      moe->children.emplace_back("router", router);
      moe->children.emplace_back("experts", experts);
      block->children.emplace_back("moe", moe);
    } else {
      block->children.emplace_back("feed_forward", node("FeedForward.Config"));
    }
    layers->children.emplace_back(std::to_string(i), block);
  }
  root->children.emplace_back("layers", layers);
  return root;
}

std::vector<ops::RopeOp> rope_plan(config::ModuleNode& root, const Qwen3Args& a, int64_t seq_len,
                                   const plugin::Registry& reg, const std::string& device) {
  std::vector<ops::RopeOp> plan;
  std::set<std::string> checked;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const std::string path = "layers." + std::to_string(i) + ".attention.rope";
    config::ModuleNode* n = root.find(path);
    check(n != nullptr, "model." + path + " is missing from the module tree");
    auto op = n->fields.find("op");
    check(op != n->fields.end() && !op->second.empty(),
          "model." + path + " (" + n->type + ") names no op");
    plan.push_back(reg.op<ops::RopeOp>(op->second, device));
    if (plan.back().check && checked.insert(op->second).second) plan.back().check(seq_len);
  }
  return plan;
}

std::vector<ops::GroupedExpertsOp> experts_plan(config::ModuleNode& root, const Qwen3Args& a,
                                                int64_t tokens, DType compute, bool log,
                                                const plugin::Registry& reg,
                                                const std::string& device) {
  std::vector<ops::GroupedExpertsOp> plan;
  if (!a.is_moe()) return plan;
  std::set<std::string> checked;
  const ops::ExpertsShape shape{tokens, a.dim, a.moe_hidden_dim, a.num_experts, a.top_k};
  for (int64_t i = 0; i < a.n_layers; ++i) {
    plan.emplace_back();
    if (!a.moe_layer(i)) continue;
    const std::string path = "layers." + std::to_string(i) + ".moe.experts";
    config::ModuleNode* n = root.find(path);
    check(n != nullptr, "model." + path + " is missing from the module tree");
    auto op = n->fields.find("op");
    check(op != n->fields.end() && !op->second.empty(),
          "model." + path + " (" + n->type + ") names no op");
    std::string dtype = dtype_op_name(compute);
    if (!reg.ops().has(ops::GroupedExpertsOp::kKind, op->second, device, dtype)) {
      if (log && checked.count(op->second) == 0)
        log::warn("experts op '" + op->second + "' has no " + device + "/" + dtype +
                  " kernel; its " + device + "/float32 kernel runs on the fp32 master weights");
      dtype = "float32";
    }
    plan.back() = reg.op<ops::GroupedExpertsOp>(op->second, device, dtype);
    if (plan.back().check && checked.insert(op->second).second) plan.back().check(shape);
  }
  return plan;
}

}  // namespace titan::qwen3
