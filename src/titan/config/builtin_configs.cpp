#include "titan/config/builtin_configs.h"

#include "titan/config/job_config.h"

namespace titan::config {

namespace {
// torchtitan's qwen3 config functions, sized for this CPU where noted.
JobConfig qwen3_debugmodel() {
  JobConfig c;
  c.model.flavor = "debugmodel";
  // torchtitan trains debugmodel with 8 × 2048 tokens per step on a GPU; a 2-core CPU gets
  // 4 × 256 so the loss visibly falls within two minutes.
  c.training.local_batch_size = 4;
  c.training.seq_len = 256;
  c.training.steps = 100;
  c.optimizer.lr = 8e-4;
  c.lr_scheduler.warmup_steps = 2;
  c.lr_scheduler.decay_ratio = 0.8;
  c.metrics.log_freq = 10;
  c.debug.seed = 42;
  return c;
}

JobConfig flavor_config(const char* flavor, double lr, int64_t warmup) {
  JobConfig c;
  c.model.flavor = flavor;
  c.training.local_batch_size = 1;
  c.training.seq_len = 4096;
  c.training.steps = 1000;
  c.optimizer.lr = lr;
  c.lr_scheduler.warmup_steps = warmup;
  c.metrics.log_freq = 1;
  return c;
}
// The seed's settings for its three runs: 10 steps of one sequence per rank on torchtitan's
// c4_test data (dataloader.dataset_path: the folder holding its data.json).
JobConfig seed_run(JobConfig c) {
  c.training.steps = 10;
  c.training.local_batch_size = 1;
  c.dataloader.dataset = "c4_test";
  return c;
}

// The seed's Hugging Face flow: Qwen3-4B built from a model directory's config.json (fetched on a
// connected machine with `hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir DIR`).
JobConfig v5_qwen3_4b() {
  JobConfig c = seed_run(flavor_config("4B", 3e-4, 600));
  c.model.hf_assets_path = "./assets/hf/Qwen3-4B-Instruct-2507";
  c.training.global_batch_size = 64;
  c.training.seq_len = 4096;
  return c;
}

// The same, fine-tuning the published weights and exporting Hugging Face safetensors at the end.
JobConfig v5_qwen3_4b_finetune() {
  JobConfig c = v5_qwen3_4b();
  c.optimizer.lr = 1e-5;
  c.lr_scheduler.warmup_steps = 10;
  c.training.steps = 100;
  c.checkpoint.enable = true;
  c.checkpoint.initial_load_in_hf = true;
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.last_save_in_hf = true;
  c.checkpoint.export_dtype = "bfloat16";
  return c;
}
// The seed's native path: the 32B config function's training settings with the 4B model spec
// and a global batch of 64 sequences.
JobConfig native_qwen3_4b() {
  JobConfig c = seed_run(flavor_config("32B", 8e-4, 600));
  c.model.flavor = "4B";
  c.training.global_batch_size = 64;
  return c;
}

// qwen3_debugmodel's run on the MoE debug flavor (64 experts, top-8, aux-loss-free balancing).
JobConfig qwen3_debugmodel_moe() {
  JobConfig c = qwen3_debugmodel();
  c.model.flavor = "debugmodel_moe";
  return c;
}

// The seed's MoE path: Qwen3-30B-A3B cut to 4 layers, 64 experts and top-4 routing, eager
// (titan has no graph compiler to turn off). The grouped experts are the "grouped_experts" op,
// which --override.imports can replace (the seed's NKI kernel attaches there).
JobConfig nki_qwen3_30b_a3b() {
  JobConfig c = seed_run(flavor_config("30B-A3B", 3e-4, 600));
  c.model.n_layers = 4;
  c.model.num_experts = 64;
  c.model.top_k = 4;
  return c;
}
}  // namespace

void register_builtin_configs() {
  register_config("native_qwen3_4b", native_qwen3_4b);
  register_config("qwen3_debugmodel_moe", qwen3_debugmodel_moe);
  register_config("qwen3_30b_a3b", [] { return flavor_config("30B-A3B", 3e-4, 600); });
  register_config("qwen3_235b_a22b", [] { return flavor_config("235B-A22B", 3e-4, 600); });
  register_config("nki_qwen3_30b_a3b", nki_qwen3_30b_a3b);
  register_config("v5_qwen3_4b", v5_qwen3_4b);
  register_config("v5_qwen3_4b_finetune", v5_qwen3_4b_finetune);
  register_config("qwen3_debugmodel", qwen3_debugmodel);
  register_config("qwen3_0_6b", [] { return flavor_config("0.6B", 3e-4, 20); });
  register_config("qwen3_1_7b", [] { return flavor_config("1.7B", 8e-4, 20); });
  register_config("qwen3_4b", [] { return flavor_config("4B", 3e-4, 600); });
  register_config("qwen3_8b", [] { return flavor_config("8B", 3e-4, 200); });
  register_config("qwen3_14b", [] { return flavor_config("14B", 3e-4, 600); });
  register_config("qwen3_32b", [] { return flavor_config("32B", 8e-4, 600); });
}

}  // namespace titan::config
