// Checkpoints with torchtitan's flags and order (torchtitan.md §6):
//   load:  {dump_folder}/{folder}/step-N with a train state  -> resume everything (latest or
//          checkpoint.load_step); else checkpoint.initial_load_path (native, or Hugging Face when
//          initial_load_in_hf); else initial_load_in_hf from model.hf_assets_path; else nothing.
//   save:  every checkpoint.interval steps and at the last step; the last one model-only (in
//          checkpoint.export_dtype, as a Hugging Face directory when last_save_in_hf) when
//          last_save_model_only. Older step-N directories beyond keep_latest_k are removed.
// Native layout of step-N/: model.safetensors (titan FQNs, fp32), optimizer.safetensors
// (exp_avg.FQN, exp_avg_sq.FQN), train_state.json (step, tokens seen, dataloader). Every save is
// written to a temporary directory and renamed, so a crash never leaves a half-written step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "titan/config/job_config.h"
#include "titan/models/model.h"

namespace titan::ckpt {

struct TrainState {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  nlohmann::json dataloader;
};

class Checkpointer {
 public:
  explicit Checkpointer(const config::JobConfig& cfg);

  // Restores per the order above. exp_avg/exp_avg_sq: the optimizer state (num_params each).
  // Returns the train state when a run was resumed.
  std::optional<TrainState> load(models::Model& model, float* exp_avg, float* exp_avg_sq);

  // Whether a save is due after `step` (enabled, and interval or last).
  bool due(int64_t step, bool last) const {
    return cfg_.checkpoint.enable && (last || step % cfg_.checkpoint.interval == 0);
  }
  // Saves if due.
  void maybe_save(const TrainState& st, bool last, const models::Model& model, const float* exp_avg,
                  const float* exp_avg_sq);

  std::string folder() const { return folder_; }

 private:
  void purge();
  config::JobConfig cfg_;
  std::string folder_;
};

// Writes the model's weights to dir as a Hugging Face Qwen3ForCausalLM directory:
// safetensors in `dtype` (float32 | bfloat16 | float16; sharded past max_shard_bytes),
// config.json and generation_config.json (based on source_dir's when it has them), and the
// tokenizer files of source_dir. Written to a temporary directory, then renamed.
void export_hf(const std::string& dir, const models::Model& model, const std::string& dtype,
               const std::string& source_dir, int64_t max_shard_bytes = int64_t{5} << 30);

// Loads model weights from a Hugging Face directory or a native step directory.
void load_model_weights(models::Model& model, const std::string& path, bool hf);

}  // namespace titan::ckpt
