// Checkpoints with torchtitan's flags and order (torchtitan.md §6):
//   load:  {dump_folder}/{folder}/step-N with a train state  -> resume everything (latest or
//          checkpoint.load_step); else checkpoint.initial_load_path (native, or Hugging Face when
//          initial_load_in_hf); else initial_load_in_hf from model.hf_assets_path; else nothing.
//   save:  every checkpoint.interval steps and at the last step; the last one model-only (in
//          checkpoint.export_dtype, as a Hugging Face directory when last_save_in_hf) when
//          last_save_model_only. Older step-N directories beyond keep_latest_k are removed.
// Native layout of step-N/: model.safetensors (titan FQNs, fp32), optimizer.safetensors
// (exp_avg.FQN, exp_avg_sq.FQN), train_state.json (step, tokens seen, dataloader position, the
// data settings it was trained with), checksums.json (size and XXH3-64 of every other file,
// checked before loading; checksums.h).
//
// Crash safety. A step is written into step-N.tmp-PID and renamed to step-N once complete. An
// existing step-N (a re-run of the same step) is replaced with renameat2(RENAME_EXCHANGE), one
// atomic swap, after which the old copy (now under the .tmp name) is removed; on a file system
// without it, step-N is renamed to step-N.old-PID, the new one into place, then .old removed.
// Older steps are purged by renaming to step-N.del-PID first. Starting a run removes what a
// killed run left (names whose PID no longer runs): .tmp and .del folders, and .old folders
// whose step-N exists; an .old folder whose step-N is missing (killed between the two renames)
// is renamed back to step-N.
//
// Which step a run resumes, and what it says:
//   - the newest step-N, or checkpoint.load_step; a step past training.steps is an error;
//   - the newest step-N holding only the exported model (last_save_model_only) at
//     training.steps: the run is finished, train() logs "already at step N = training.steps";
//     before training.steps: a warning, then the newest full checkpoint;
//   - a newest step-N lacking a file, failing its checksums or holding a bad train_state.json:
//     an error naming the file and the newest older complete step (--checkpoint.load_step K).
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
  nlohmann::json dataloader;  // the loader's position (null: none recorded)
  nlohmann::json data;        // the data settings of the run that saved it (null: not recorded)
  std::string path;           // the train_state.json it was read from, for messages
  // Resumed from a model-only export at training.steps: the run already finished; nothing else
  // was loaded.
  bool finished = false;
};

class Checkpointer {
 public:
  // Throws titan::Error for an empty dump_folder.
  explicit Checkpointer(const config::JobConfig& cfg);

  // Removes what killed runs left in the checkpoint folder (see above), then restores per the
  // order above. exp_avg/exp_avg_sq: the optimizer state (num_params each). Returns the train
  // state when a run was resumed.
  std::optional<TrainState> load(models::Model& model, float* exp_avg, float* exp_avg_sq);

  // Whether a save is due after `step` (enabled, and interval or last).
  bool due(int64_t step, bool last) const {
    return cfg_.checkpoint.enable && (last || step % cfg_.checkpoint.interval == 0);
  }
  // Saves if due; on failure (a full disk) nothing of the new step remains and titan::Error names
  // the file.
  void maybe_save(const TrainState& st, bool last, const models::Model& model, const float* exp_avg,
                  const float* exp_avg_sq);

  std::string folder() const { return folder_; }

 private:
  void purge();
  void clean_stale();
  TrainState load_full(models::Model& model, float* exp_avg, float* exp_avg_sq,
                       const std::string& dir, int64_t step);
  config::JobConfig cfg_;
  std::string folder_;
};

// Writes the model's weights to dir as a Hugging Face Qwen3ForCausalLM directory:
// safetensors in `dtype` (float32 | bfloat16 | float16; sharded past max_shard_bytes),
// config.json and generation_config.json (based on source_dir's when it has them), the
// tokenizer files of source_dir, and checksums.json. Written to a temporary directory, then
// renamed (replacing an existing dir as a checkpoint step is).
void export_hf(const std::string& dir, const models::Model& model, const std::string& dtype,
               const std::string& source_dir, int64_t max_shard_bytes = int64_t{5} << 30);

// Loads model weights from a Hugging Face directory or a native step directory, after checking
// the directory's checksums.json when it has one (verify).
void load_model_weights(models::Model& model, const std::string& path, bool hf, bool verify = true);

// Refuses an empty dump_folder (it would put metrics.jsonl at the file-system root and the
// checkpoints in the current directory).
void check_dump_folder(const config::JobConfig& cfg);

}  // namespace titan::ckpt
