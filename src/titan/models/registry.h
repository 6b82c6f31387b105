// Models by model.name (torchtitan's model registry / ModelSpec) and the one build function
// every command uses: module tree -> overrides (--override.imports) -> op plans -> model -> init.
// Adding a model is a folder under models/ plus one line in registry.cpp.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/config/module_tree.h"
#include "titan/models/context_parallel.h"
#include "titan/models/model.h"
#include "titan/ops/experts_op.h"

namespace titan::models {

// What to build: microbatch capacity and the init.
struct BuildOptions {
  int64_t batch = 1;    // rows per microbatch
  int64_t seq_len = 1;  // tokens per sequence
  // Context parallelism: each microbatch row holds seq_len / cp tokens, this rank's chunks of
  // its sequence (models/context_parallel.h); positions still run to seq_len.
  int64_t cp = 1;
  int64_t loss_chunks = 8;
  bool init = true;  // seeded random init (off when weights are loaded right after)
  uint64_t seed = 0;
  bool allocate = true;  // false: a plan-only model (params() and activation_table() only)
  bool log_overrides = true;
  AcPolicy ac;  // activation checkpointing
  // Bytes per parameter the caller will hold, and what they are, for the message: the model's
  // fp32 weights and gradients (8), plus the AdamW moments when training (the trainer says how
  // many). Checked against the machine's memory before anything is allocated (0: not checked).
  int64_t bytes_per_param = 8;
  std::string bytes_hold = "parameters and gradients";
  // false: the model's own parameters are frozen (no gradient buffer, no weight gradients): the
  // base of LoRA adapters. build_model wraps the model in adapters when cfg.lora.rank > 0.
  bool trainable = true;
  // Applied to each MoE layer's grouped-experts op once the overrides chose it (one call per
  // layer): how a trainer puts expert parallelism's dispatch around the kernel
  // (train/expert_parallel.h) without the model knowing of ranks. Empty: the op as chosen.
  std::function<ops::GroupedExpertsOp(ops::GroupedExpertsOp)> wrap_experts;
  // Tensor parallelism: the slice of the layout to build (models/tensor_parallel.h); whole by
  // default.
  TpSlice tp;
  // Where the model computes (training.device): its backend's device (ops/backend.h); the ops
  // each layer calls are looked up under it. Off the CPU the model's weights, gradients and
  // activations live in device memory (models::ParamStore::param_data()).
  std::string device = "cpu";
  // The parameters will be sharded unit by unit (FSDP, train/fsdp.h): on a device that can commit
  // memory a granule at a time (core/device.h reserve), the flat weight, gradient and compute-copy
  // buffers are reserved, not allocated whole, and each unit takes memory only while its hooks
  // hold it. The host's buffers do so anyway (pages taken when written).
  bool sharded = false;
};

struct ModelSpec {
  std::string name;
  // Checks the model section of a config (the architecture it resolves to, the sequence length
  // against its context); throws titan::Error naming the field.
  std::function<void(const config::JobConfig&)> validate;
  // The resolved architecture, as '# ...' lines for `titan config show` / debug.print_config.
  std::function<std::string(const config::JobConfig&)> describe;
  // The module config tree for cfg, before overrides (root path "model").
  std::function<std::shared_ptr<config::ModuleNode>(const config::JobConfig&, int64_t seq_len)>
      module_tree;
  // The model from its (overridden) module tree.
  std::function<std::unique_ptr<Model>(const config::JobConfig&, config::ModuleNode& tree,
                                       const BuildOptions&)>
      build;
  // torchtitan's parallelize_<model>: a model built on a tensor-parallel slice (BuildOptions::tp)
  // gets its redistributions over the group's collectives; a no-op on a whole model.
  std::function<void(Model&, TpHooks*)> parallelize;
  // torchtitan's apply_cp: attention of a model whose microbatch rows are this rank's chunks of
  // the sequence, over the cp group (models/context_parallel.h). Empty: the model has none.
  std::function<void(Model&, const ContextAttention&)> context_parallel;
};

// The spec registered under `name`; throws titan::Error listing the models there are.
const ModelSpec& model_spec(const std::string& name);
std::vector<std::string> model_names();

// model_spec(cfg.model.name).validate(cfg).
void validate_model_config(const config::JobConfig& cfg);

// The module tree with the overrides of cfg.override_.imports applied (plugins loaded first);
// logs one line per replaced node.
std::shared_ptr<config::ModuleNode> overridden_module_tree(const config::JobConfig& cfg,
                                                           int64_t seq_len, bool log = true);

// The model for cfg: overridden module tree, ops per layer, buffers for `opt` microbatches,
// seeded init when opt.init. With cfg.lora.rank > 0 (or lora.adapter_path, whose
// adapter_config.json sets the rank and targets): LoRA adapters (models/lora.h) on the frozen
// model, freshly initialized (the caller loads the base's weights into frozen_base() and an
// adapter from lora.adapter_path).
std::unique_ptr<Model> build_model(const config::JobConfig& cfg, const BuildOptions& opt);

}  // namespace titan::models
