// Checkpoints with torchtitan's flags and order (torchtitan.md §6):
//   load:  {dump_folder}/{folder}/step-N with a train state  -> resume everything (latest or
//          checkpoint.load_step); else checkpoint.initial_load_path (native, or Hugging Face when
//          initial_load_in_hf); else initial_load_in_hf from model.hf_assets_path; else nothing.
//   save:  every checkpoint.interval steps and at the last step; the last one model-only (in
//          checkpoint.export_dtype, as a Hugging Face directory when last_save_in_hf) when
//          last_save_model_only. Older step-N directories beyond keep_latest_k are removed.
// Native layout of step-N/: model.safetensors (titan FQNs, fp32), optimizer.safetensors
// (exp_avg.FQN, exp_avg_sq.FQN, F32 or BF16 as optimizer.state_dtype), train_state.json (step,
// tokens seen, dataloader position, the data settings it was trained with), checksums.json (size
// and XXH3-64 of every other file, checked before loading; checksums.h).
//
// Sharded layout of step-N/ (FSDP/HSDP, tensor and expert parallelism: the ranks of one replica
// write in parallel, each what it holds: its range of the flat parameter buffer, models/model.h,
// of its slices of the tensors; a parameter replicated over a tp group is written by tp rank 0):
//   shard-0000r-of-0000S.safetensors  rank r's elements of every parameter and AdamW moment it
//       writes, each a 1-D tensor under the unsharded name (FQN, exp_avg.FQN, exp_avg_sq.FQN;
//       F32, the moments BF16 under optimizer.state_dtype bfloat16); shard 0 also holds the
//       persistent buffers whole;
//   checkpoint.index.json  {"format": "titan-sharded-checkpoint", "version": 1 or 2, "shards": S,
//       "tensors": {name: {"shape": [global shape], "slices": [entry, ...]}}}, an entry telling
//       which elements of the flattened tensor a file holds: [file, begin, end] the range
//       [begin, end) as the file's tensor; version 2 adds [file, begin, end, at, count, stride]:
//       `count` runs of end − begin elements, run i at begin + i·stride of the tensor and at
//       at + i·(end − begin) of the file's (a tensor-parallel slice: rows cut on a dimension).
//       Version 1 is written when every entry is of the first kind (data parallelism alone).
//       The entries must cover every tensor exactly once (else the load names the tensor and the
//       element where a slice is missing);
//   train_state.json and checksums.json as above (each shard's checksums computed by its writer).
// Either layout loads into any layout (and one process): every rank reads the parameters (or
// the slices) it holds and the moments of its own range; the full tensors come out bitwise.
// The commit: rank 0 makes step-N.tmp-PID, every writer writes its file there, and after a
// barrier rank 0 writes the index, the train state and the checksums and renames the folder to
// step-N. The rename is the marker: a folder without it is never loaded (a killed job's is
// removed by the next run, as below).
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
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/safetensors.h"
#include "titan/config/job_config.h"
#include "titan/models/model.h"

namespace titan::ckpt {

struct TrainState {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  nlohmann::json dataloader;  // the loader's position (null: none recorded)
  nlohmann::json data;        // the data settings of the run that saved it (null: not recorded)
  std::string path;           // the train_state.json it was read from, for messages
  // The dtype the AdamW moments were saved in (optimizer.state_dtype; empty: float32).
  std::string optimizer_state_dtype;
  // Resumed from a model-only export at training.steps: the run already finished; nothing else
  // was loaded.
  bool finished = false;
};

// A rank's shard of the flat parameter buffer (FSDP: its block of every unit); its shard buffers
// are their concatenation.
using FlatRange = models::FlatRange;
using Segments = std::vector<FlatRange>;
// The AdamW moments (exp_avg m, exp_avg_sq v) a call reads or writes, host arrays over the flat
// range it covers, in float32 or bfloat16 (optimizer.state_dtype): saved in their dtype, loaded
// from either (a conversion logs a warning). Null pointers: no moments (a model-only save).
// Moments the checkpointer converts through fp32 (the 8-bit state, optim/state.h): saved as F32
// tensors, loaded from F32 or BF16. Ranges start and end at a parameter, or at the piece of one
// that a rank's range holds.
class MomentCodec {
 public:
  virtual ~MomentCodec() = default;
  virtual void decode(bool first, int64_t at, int64_t len, float* out) const = 0;
  virtual void encode(bool first, int64_t at, int64_t len, const float* in) = 0;
};

struct Moments {
  DType dtype = DType::F32;
  void* m = nullptr;
  void* v = nullptr;
  MomentCodec* codec = nullptr;  // set: m and v unused, elements go through it as fp32
  Moments() = default;
  Moments(float* m32, float* v32) : m(m32), v(v32) {}
  Moments(DType dt, void* m_, void* v_) : dtype(dt), m(m_), v(v_) {}
  explicit Moments(MomentCodec* c) : codec(c) {}
  // The tensor of shape's elements from at on of m (first) or v as written: in dtype, or
  // through the codec (filled slice by slice as it is written).
  WriteTensor tensor(std::string name, bool first, std::vector<int64_t> shape, int64_t at) const;
  // Element i of m (first) or v.
  void* at(bool first, int64_t i) const {
    return static_cast<char*>(first ? m : v) + i * static_cast<int64_t>(dtype_size(dtype));
  }
};

// Called after each parameter unit's weights are loaded (models::ParamUnit index): a sharded
// trainer takes its block and gives the rest back before the next unit is read.
using UnitDone = std::function<void(int64_t unit)>;

inline constexpr const char* kShardedIndexName = "checkpoint.index.json";

class Checkpointer {
 public:
  // Throws titan::Error for an empty dump_folder.
  explicit Checkpointer(const config::JobConfig& cfg);

  // Removes what killed runs left in the checkpoint folder (see above), then restores per the
  // order above: the whole parameters into the model, the optimizer state of the segments `opt`
  // (empty: the whole buffer) into exp_avg/exp_avg_sq. Returns the train state when a run was
  // resumed.
  // With unit_done (a sharded trainer), a resumed checkpoint's weights are read unit by unit,
  // unit_done called after each; Hugging Face initial weights are read only within `opt` (the
  // rank's slices, from the memory-mapped files); native initial weights are read whole.
  // A model that holds slices of its parameters (tensor/expert parallelism: ParamInfo::
  // split_dim) reads just those slices, of checkpoints of any layout and of initial weights.
  std::optional<TrainState> load(models::Model& model, const Moments& moments,
                                 const Segments& opt = {}, const UnitDone& unit_done = {});

  // Whether a save is due after `step` (enabled, and interval or last).
  bool due(int64_t step, bool last) const {
    return cfg_.checkpoint.enable && (last || step % cfg_.checkpoint.interval == 0);
  }
  // Saves if due; on failure (a full disk) nothing of the new step remains and titan::Error names
  // the file.
  void maybe_save(const TrainState& st, bool last, const models::Model& model,
                  const Moments& moments);

  // A sharded save (the layout above), in the three parts the trainer calls around its
  // collectives. Rank 0: the fresh temporary folder of step-N.
  std::string sharded_begin(int64_t step);
  // Every writer (writer w of `writers`: world rank w of replica 0): its shard file in tmp,
  // holding the elements of every (non-alias) parameter that lie in segs (this rank's FSDP
  // segments, or the whole flat buffer), of the slice it holds under tensor/expert parallelism,
  // and of their AdamW moments; params, exp_avg and exp_avg_sq concatenate segs (params nullptr:
  // the model's own). with_replicated false: the parameters this rank holds whole (replicated
  // over its tp group) are left to tp rank 0. Writer 0 also writes the persistent buffers.
  // Returns {"sums": its checksums.json entry, "slices": {tensor: its index entries}}.
  nlohmann::json write_shard(const std::string& tmp, int64_t writer, int64_t writers,
                             const Segments& segs, const models::Model& model, const float* params,
                             const Moments& moments, bool with_replicated = true) const;
  // Rank 0, once every writer has finished (`written`: their returns, in writer order): the
  // index, train state and checksums, then the rename to step-N and the purge of older steps.
  // On failure tmp is removed and titan::Error names the file.
  void sharded_commit(const std::string& tmp, const TrainState& st, const models::Model& model,
                      const nlohmann::json& written);

  // The last save as a Hugging Face export (last_save_in_hf) by the ranks of a sharded run, in
  // parallel: rank 0 makes the temporary folder (sharded_begin); the writer of each part fills
  // an HfPart unit by unit, while each unit is whole, and writes it; rank 0 then writes
  // model.safetensors.index.json (the parts' weight maps), config.json, generation_config.json,
  // the tokenizer files and the checksums, and renames the folder to step-N. On failure tmp is
  // removed and titan::Error names the file.
  void hf_parts_commit(const std::string& tmp, int64_t step, const models::Model& model,
                       const nlohmann::json& parts);

  std::string folder() const { return folder_; }

 private:
  void purge();
  void clean_stale();
  TrainState load_full(models::Model& model, const Moments& moments, const Segments& opt,
                       const UnitDone& unit_done, const std::string& dir, int64_t step);
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

// One file of a parallel Hugging Face export (Checkpointer::hf_parts_commit): the model's HF
// tensors of the units added (copied, in the export dtype: the unit may be resharded after).
class HfPart {
 public:
  void add_unit(const models::Model& model, int64_t unit, const std::string& dtype);
  // Writes tmp/model-{part+1}-of-{parts}.safetensors; returns its "weight_map", "total_size"
  // (data bytes) and "sums" (its checksums.json entry).
  nlohmann::json write(const std::string& tmp, int64_t part, int64_t parts) const;

 private:
  std::vector<WriteTensor> tensors_;
  std::vector<std::vector<uint8_t>> storage_;
};

// Loads model weights from a Hugging Face directory or a native step directory, after checking
// the directory's checksums.json when it has one (verify). only: Hugging Face weights read
// within these ranges alone (models::Model::load_hf).
void load_model_weights(models::Model& model, const std::string& path, bool hf, bool verify = true,
                        const Segments* only = nullptr);

// load_model_weights into the model, or for LoRA adapters (models::Model::frozen_base) into
// their base; then the PEFT adapter directory adapter_path (when not empty) into the adapters.
void load_model_and_adapter(models::Model& model, const std::string& path, bool hf,
                            const std::string& adapter_path);

// Refuses an empty dump_folder (it would put metrics.jsonl at the file-system root and the
// checkpoints in the current directory).
void check_dump_folder(const config::JobConfig& cfg);

}  // namespace titan::ckpt
