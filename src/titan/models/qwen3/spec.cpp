#include "titan/models/qwen3/spec.h"

#include <cstdio>
#include <limits>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/hf_config.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/modules.h"
#include "titan/models/qwen3/parallelize.h"
#include "titan/ops/device.h"

namespace titan::qwen3 {

Qwen3Args args_from_config(const config::JobConfig& c) {
  Qwen3Args a = c.model.hf_assets_path.empty() ? flavor(c.model.flavor)
                                               : args_from_hf_config(c.model.hf_assets_path);
  auto over = [](int64_t v, int64_t& dst) {
    if (v != 0) dst = v;
  };
  over(c.model.n_layers, a.n_layers);
  over(c.model.dim, a.dim);
  over(c.model.n_heads, a.n_heads);
  over(c.model.n_kv_heads, a.n_kv_heads);
  over(c.model.head_dim, a.head_dim);
  over(c.model.hidden_dim, a.hidden_dim);
  over(c.model.vocab_size, a.vocab_size);
  if (c.model.rope_theta != 0) a.rope_theta = c.model.rope_theta;
  a.attn_mask_type = c.model.attn_mask_type;
  for (const auto& [v, field] : {std::pair{c.model.num_experts, "num_experts"},
                                 {c.model.top_k, "top_k"},
                                 {c.model.moe_hidden_dim, "moe_hidden_dim"}})
    check(v >= 0, std::string("model.") + field + " must be positive, got " + std::to_string(v));
  if (c.model.num_experts != 0 || c.model.top_k != 0 || c.model.moe_hidden_dim != 0)
    check(
        a.is_moe() || (c.model.num_experts > 0 && c.model.top_k > 0 && c.model.moe_hidden_dim > 0),
        "model.num_experts/top_k/moe_hidden_dim apply to MoE models; pick an MoE flavor "
        "(debugmodel_moe, 30B-A3B, 235B-A22B) or set all three");
  over(c.model.num_experts, a.num_experts);
  over(c.model.top_k, a.top_k);
  over(c.model.moe_hidden_dim, a.moe_hidden_dim);
  if (c.model.load_balance_coeff >= 0) a.load_balance_coeff = c.model.load_balance_coeff;
  if (c.model.router_aux_loss) a.router_aux_loss = true;
  if (c.model.router_aux_loss_coef >= 0) a.router_aux_loss_coef = c.model.router_aux_loss_coef;
  a.validate();
  return a;
}

std::string model_source(const config::JobConfig& c) {
  return c.model.hf_assets_path.empty() ? "flavor '" + c.model.flavor + "'"
                                        : c.model.hf_assets_path + "/config.json";
}

void check_fits_in_memory(const Qwen3Args& a, int64_t bytes_per_param, const std::string& what,
                          int64_t memory_bytes, const std::string& source) {
  if (memory_bytes <= 0) return;
  int64_t n = 0, bytes = 0;
  const bool counted = a.param_count(&n);
  if (counted && !__builtin_mul_overflow(n, bytes_per_param, &bytes) && bytes <= memory_bytes)
    return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double need = counted ? static_cast<double>(n) * static_cast<double>(bytes_per_param)
                              : std::numeric_limits<double>::infinity();
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.4g GiB (%.4g parameters × %lld bytes)", need / kGiB,
                static_cast<double>(n), static_cast<long long>(bytes_per_param));
  char have[64];
  std::snprintf(have, sizeof have, "%.1f GiB", static_cast<double>(memory_bytes) / kGiB);
  throw Error("the model (" + source + ") needs " + buf + " for its " + what +
              "; this machine has " + have +
              " (MemTotal); reduce model.n_layers, model.dim, "
              "model.hidden_dim or model.vocab_size" +
              (a.is_moe() ? std::string(" (or model.num_experts, model.moe_hidden_dim)") : "") +
              ", or pick a smaller model.flavor");
}

namespace {

void validate(const config::JobConfig& c) {
  const Qwen3Args a = args_from_config(c);
  const int64_t seq_len = c.training.seq_len;
  const std::string source = model_source(c);
  check(seq_len <= a.max_seq_len, "training.seq_len " + std::to_string(seq_len) +
                                      " exceeds the maximum context of " + source + " (" +
                                      std::to_string(a.max_seq_len) + ")");
  // The tensor/expert-parallel layout must split whole heads and experts.
  check_parallel_layout(
      a,
      {c.parallelism.tensor_parallel_degree, c.parallelism.expert_parallel_degree,
       c.parallelism.enable_sequence_parallel,
       c.training.local_batch_size * seq_len /
           std::max<int64_t>(1, c.parallelism.context_parallel_degree)},
      source);
}

std::string describe(const config::JobConfig& c) {
  const Qwen3Args a = args_from_config(c);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "\n# resolved model\n# vocab_size=%lld dim=%lld n_layers=%lld n_heads=%lld "
                "n_kv_heads=%lld head_dim=%lld hidden_dim=%lld rope_theta=%g max_seq_len=%lld "
                "tie_embeddings=%s attn_mask_type=%s\n",
                static_cast<long long>(a.vocab_size), static_cast<long long>(a.dim),
                static_cast<long long>(a.n_layers), static_cast<long long>(a.n_heads),
                static_cast<long long>(a.n_kv_heads), static_cast<long long>(a.head_dim),
                static_cast<long long>(a.hidden_dim), a.rope_theta,
                static_cast<long long>(a.max_seq_len), a.tie_embeddings ? "true" : "false",
                a.attn_mask_type.c_str());
  std::string out = buf;
  if (a.is_moe()) {
    std::snprintf(buf, sizeof buf,
                  "# num_experts=%lld top_k=%lld moe_hidden_dim=%lld moe_layers=%lld "
                  "norm_topk_prob=%s router_aux_loss=%s router_aux_loss_coef=%g "
                  "load_balance_coeff=%g\n",
                  static_cast<long long>(a.num_experts), static_cast<long long>(a.top_k),
                  static_cast<long long>(a.moe_hidden_dim),
                  static_cast<long long>(a.n_moe_layers()), a.norm_topk_prob ? "true" : "false",
                  a.router_aux_loss ? "true" : "false", a.router_aux_loss_coef,
                  a.load_balance_coeff);
    out += buf;
  }
  return out;
}

}  // namespace

models::ModelSpec model_spec() {
  models::ModelSpec s;
  s.name = "qwen3";
  s.validate = validate;
  s.describe = describe;
  s.module_tree = [](const config::JobConfig& c, int64_t seq_len) {
    return build_module_tree(args_from_config(c), seq_len);
  };
  s.build = [](const config::JobConfig& c, config::ModuleNode& tree,
               const models::BuildOptions& o) -> std::unique_ptr<models::Model> {
    const Qwen3Args a = args_from_config(c);
    if (o.bytes_per_param > 0)  // 0: titan plan, which reports rather than refuses; off the CPU
                                // the host keeps a copy of the weights (the device is planned
                                // by the trainer)
      check_fits_in_memory(a, ops::device(o.device).host ? o.bytes_per_param : 4,
                           ops::device(o.device).host ? o.bytes_hold : "parameters",
                           cpu::total_memory_bytes(), model_source(c));
    const DType compute = c.training.mixed_precision_param == "bfloat16" ? DType::BF16 : DType::F32;
    const int64_t rows = o.seq_len / o.cp;  // tokens per microbatch row
    auto experts = experts_plan(tree, a, o.batch * rows, compute, o.log_overrides,
                                plugin::Registry::global(), o.device);
    if (o.wrap_experts)
      for (auto& op : experts)
        if (op.forward) {
          op = o.wrap_experts(std::move(op));
          if (op.check)
            op.check({o.batch * rows, a.dim, a.moe_hidden_dim, a.num_experts, a.top_k});
        }
    Qwen3Options m;
    m.max_batch = o.batch, m.max_seq = rows, m.max_positions = o.seq_len;
    m.loss_chunks = o.loss_chunks;
    m.rope_ops = rope_plan(tree, a, o.seq_len, plugin::Registry::global(), o.device);
    m.experts_ops = std::move(experts);
    m.allocate = o.allocate, m.ac = o.ac, m.compute = compute, m.trainable = o.trainable;
    m.tp = o.tp, m.device = o.device, m.sharded = o.sharded;
    m.bf16_masters = o.trainable && c.training.dtype == "bfloat16";
    return std::make_unique<Qwen3Model>(a, std::move(m));
  };
  s.parallelize = parallelize;
  s.context_parallel = context_parallel;
  return s;
}

}  // namespace titan::qwen3
