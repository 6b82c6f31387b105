// The training loop in torchtitan's step order (torchtitan.md §4.3): zero grads, read the LR,
// pull every microbatch of the step and count valid tokens, forward+backward each with the loss
// normalized by the step's valid tokens, clip by the global L2 norm (logging the norm before
// clipping), stop on a non-finite loss or norm before any update, AdamW, LR step, metrics.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/config/job_config.h"
#include "titan/core/buffer.h"
#include "titan/data/packed_loader.h"
#include "titan/dist/parallel_dims.h"
#include "titan/models/model.h"
#include "titan/models/registry.h"
#include "titan/ops/backend.h"
#include "titan/optim/adamw.h"
#include "titan/optim/kernels.h"
#include "titan/optim/lr_schedule.h"
#include "titan/optim/state.h"
#include "titan/parallel/context_parallel.h"
#include "titan/parallel/expert_parallel.h"
#include "titan/parallel/fsdp.h"
#include "titan/parallel/tensor_parallel.h"
#include "titan/train/dpo.h"
#include "titan/train/metrics.h"
#include "titan/train/step_in_backward.h"
#include "titan/train/validator.h"

namespace titan::train {

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;  // loss includes coef · aux when the aux loss is on
  int64_t valid_tokens = 0;
  double aux_loss = std::nan("");                    // mean over microbatches; NaN when off
  std::vector<StepMetrics::ExpertLoad> expert_load;  // per MoE layer
  int64_t tokens = 0;  // the tokens this rank ran forward and backward
  std::vector<std::pair<std::string, double>> objective;  // the objective's metrics (DPO's)
};

class Trainer {
 public:
  // docs: the documents to train on; empty = load them as the config says.
  explicit Trainer(const config::JobConfig& cfg, std::vector<std::string> docs = {});

  // One optimizer step; throws titan::Error (before updating anything) on a non-finite loss
  // or gradient norm.
  StepResult step();
  // The whole run: training.steps steps with logging; a run resumed at training.steps logs
  // "Already at step N = training.steps" and does nothing.
  void train();

  models::Model& model() { return *model_; }
  int64_t current_step() const { return step_; }
  int64_t grad_accum_steps() const { return grad_accum_; }
  // Saves a checkpoint if one is due after the current step (train() calls it every step).
  void maybe_checkpoint();
  // One validation now (validator.enable must be on); train() runs it when due. A non-finite
  // validation loss is a titan::Error naming the non-finite weights, if any.
  ValidationResult validate();

 private:
  // The constructor's steps, in order (trainer.cpp says what each builds).
  void setup_parallelism();
  models::BuildOptions build_options() const;
  void build_data(std::vector<std::string> docs, int64_t vocab);
  void build_model(const models::Model& shape, models::BuildOptions bo,
                   const ops::Backend& backend);
  void build_optimizer_state(const ops::Backend& backend);
  std::optional<ckpt::TrainState> load_weights(uint64_t seed);
  void find_replicated();
  void log_layout() const;
  void setup_step_in_backward();

  // dpo.enable: this rank's pairs of the step through the DPO loss (train/dpo.h), and the
  // reference log-probabilities of the starting weights (computed at step 0, read on a resume).
  void dpo_microbatches(StepResult& r);
  void text_microbatches(StepResult& r);
  void reduce_routing(StepResult& r, double aux_sum, int64_t passes);
  void dpo_reference();
  std::vector<data::PreferencePair> pairs_;
  std::vector<PairLogps> ref_logps_;
  std::unique_ptr<PairOrder> pair_order_;  // dataloader.shuffle and seed, as for documents
  int64_t dpo_pad_to() const;

  // The settings recorded in train_state.json ("data"): tokenizer, batch sizes, seq_len.
  nlohmann::json data_settings() const;
  // Checks the resumed state's data settings against this run's, restores the loader.
  void resume_data(const ckpt::TrainState& st);

  // Data parallelism: the step's gradient reduction across replicas (all-reduce; FSDP has
  // reduce-scattered each unit's gradient within the replica during the backward), the global
  // norm, clipping and the AdamW update of this rank's shard (FSDP) or of everything. With one
  // process every group has one rank.
  void reduce_and_update(StepResult& r);
  bool rank0() const { return dist::world().rank() == 0; }
  // training.dtype bfloat16: whether the bf16 masters are the only ones now (FSDP's shard, or the
  // model's store), and the fp32 masters made whole (exact) or given back again.
  bool masters_released() const;
  void widen_masters();
  void release_masters();
  // The stochastic rounding's key of a step: of the bf16 moments, or of the bf16 master weights.
  uint64_t rounding_key(int64_t step, bool weights = false) const;

  config::JobConfig cfg_;
  dist::ParallelDims dims_;
  dist::Meshes mesh_;
  int64_t step_comm_bytes_ = 0;  // sent by the step's fsdp/replicate collectives so far
  int64_t ep_comm_bytes_ = 0;
  std::shared_ptr<parallel::DispatchBuffers> ep_buffers_;  // expert parallelism's (null without)
  parallel::DispatchSeconds ep_seconds_;                   // their time in the steps so far
  // Tensor parallelism (tp > 1): the tp group's hooks; the whole model the model-only export
  // goes through (weights only, built when needed and dropped after); the steps' bytes and
  // seconds in the TP collectives; the replicated parameters' ranges in the optimizer's buffer
  // (the shard under FSDP), which the gradient norm counts once, not once per tp rank.
  std::unique_ptr<parallel::TensorParallel> tp_;
  std::unique_ptr<parallel::ContextParallel> cp_;
  std::vector<int32_t> cp_rows_;  // context parallelism: a microbatch's rows before the split
  // Parallelism on a device: the replicate, fsdp, efsdp, ep and tp groups over its memory (NCCL
  // on GPUs; dist/device_group.h), for the gradients, parameters, dispatched rows and
  // activations (the host groups keep the scalars: token counts, losses, norms, expert counts).
  std::unique_ptr<dist::Communicator> grad_replicate_, fsdp_group_, efsdp_group_, ep_rows_,
      tp_data_;
  std::unique_ptr<models::Model> whole_;
  int64_t tp_comm_bytes_ = 0, cp_comm_bytes_ = 0;
  double tp_seconds_ = 0, cp_seconds_ = 0;
  std::vector<models::FlatRange> replicated_;
  models::Model& whole_model();
  // A model built for a slice of the layout (tensor parallelism, or expert parallelism's own
  // experts): it reads only its slices (checkpoints and initial weights); checkpoints are
  // sharded, each rank writing its slices; the model-only export at the end: every slice
  // gathered, rank 0 writes the whole model.
  bool sliced() const { return dims_.tp > 1 || dims_.ep > 1; }
  void export_sliced(const ckpt::TrainState& st, bool last);
  std::unique_ptr<models::Model> model_;
  std::unique_ptr<parallel::Fsdp> fsdp_;  // dp_shard > 1: the model's parameters sharded (ZeRO-3)
  std::unique_ptr<data::PackedLoader> loader_;
  std::unique_ptr<Validator> validator_;  // when validator.enable
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  // AdamW state of this rank's shard (or all), in the model's memory (a device's off the CPU),
  // and the optimizer's kernels there (optim/kernels.h).
  optim::AdamWState state_;
  const optim::Kernels* opt_ = nullptr;
  // optimizer.early_step_in_backward: the model's parameter hooks that update unit by unit.
  std::unique_ptr<StepInBackward> step_in_backward_;
  // The AdamW moments (and FSDP's master shard) as host arrays for the checkpointer: the buffers
  // themselves on the CPU; off it, host copies (fetched from the device when `fetch`; send() puts
  // the moments back: the masters are loaded through the model).
  struct HostMoments {
    explicit HostMoments(Trainer& t, bool fetch = false);
    void send();
    ckpt::Moments moments() {
      if (t.state_.dtype() == DType::I8) return ckpt::Moments(&codec);
      return {t.state_.dtype(), m, v};
    }
    // The 8-bit state (on the host) read and written through fp32.
    struct Codec final : ckpt::MomentCodec {
      explicit Codec(optim::AdamWState& s) : state(s) {}
      void decode(bool first, int64_t at, int64_t len, float* out) const override {
        state.decode(first, at, len, out);
      }
      void encode(bool first, int64_t at, int64_t len, const float* in) override {
        state.encode(first, at, len, in);
      }
      optim::AdamWState& state;
    };
    Trainer& t;
    Buffer<uint8_t> hm, hv;
    Buffer<float> hp;
    void *m, *v;
    float* master;  // null without FSDP, or off the CPU when not fetched
    Codec codec{t.state_};
  };
  Buffer<int32_t> input_, labels_, positions_;  // all microbatches of one step
  std::vector<int32_t> skip_;                   // the other data ranks' microbatches, read past
  optim::AdamWConfig adamw_;
  optim::LRSchedule sched_;
  int64_t step_ = 0, grad_accum_ = 1, tokens_seen_ = 0;
  int64_t first_step_ = 0;  // step_ when this process started (after a resume)
  bool resumed_ = false;
  double data_time_ = 0;    // seconds spent loading data in the last step
  bool text_data_ = false;  // the dataset is text tokenized by dataloader.tokenizer
};

}  // namespace titan::train
