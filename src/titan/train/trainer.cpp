#include "titan/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/core/rng.h"
#include "titan/core/test_hooks.h"
#include "titan/data/chat_dataset.h"
#include "titan/data/dataset.h"
#include "titan/dist/device_group.h"
#include "titan/dist/nccl/nccl_group.h"
#include "titan/models/registry.h"
#include "titan/ops/backend.h"
#include "titan/ops/device.h"
#include "titan/ops/gemm.h"
#include "titan/parallel/expert_parallel.h"
#include "titan/tools/memory_plan.h"
#include "titan/train/reports.h"
#include "titan/train/step_in_backward.h"
#include "titan/train/weights_check.h"

namespace titan::train {

namespace {

// The random streams of the stochastic rounding (plus the rank's shard: rounding_key).
constexpr uint64_t kRoundingStream = 0x5352000000000000ull;        // bf16 moments
constexpr uint64_t kWeightRoundingStream = 0x5357000000000000ull;  // bf16 master weights

// Whether two dataloader.tokenizer values name the same tokenizer (equal, or the same directory
// written differently).
// *s of rank root, on every rank of group c.
void broadcast_string(dist::Communicator& c, std::string* s, int root) {
  int64_t len = static_cast<int64_t>(s->size());
  c.broadcast(&len, sizeof len, root);
  s->resize(static_cast<size_t>(len));
  c.broadcast(s->data(), len, root);
}

bool same_tokenizer(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea);
  const auto cb = std::filesystem::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

// Every rank's value of j, in rank order, on every rank of group c.
nlohmann::json gather_json(dist::Communicator& c, const nlohmann::json& j) {
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < c.size(); ++r) {
    std::string s = r == c.rank() ? j.dump() : "";
    broadcast_string(c, &s, r);
    all.push_back(nlohmann::json::parse(s));
  }
  return all;
}

// LoRA (models/lora.h): the frozen base's weights from the initial checkpoint or
// model.hf_assets_path, then the adapters of lora.adapter_path. Every start loads them (a
// checkpoint holds only the adapters and their optimizer state).
void load_lora_weights(const config::JobConfig& c, models::Model& m) {
  const auto& k = c.checkpoint;
  if (!k.initial_load_path.empty()) {
    ckpt::load_model_and_adapter(m, k.initial_load_path, k.initial_load_in_hf, c.lora.adapter_path);
    log::info("LoRA: base weights from " + k.initial_load_path);
    return;
  }
  if (k.initial_load_in_hf) {
    ckpt::load_model_and_adapter(m, c.model.hf_assets_path, true, c.lora.adapter_path);
    log::info("LoRA: base weights from " + io::absolute_path(c.model.hf_assets_path));
    return;
  }
  log::warn(
      "LoRA on a randomly initialized base model: to fine-tune a published model, pass "
      "--model.hf_assets_path DIR --checkpoint.initial_load_in_hf");
  if (!c.lora.adapter_path.empty()) {
    ckpt::load_model_weights(m, c.lora.adapter_path, true);
    log::info("LoRA: adapters from " + c.lora.adapter_path);
  }
}

// This process's index among the ranks on its machine (mpirun's OMPI_COMM_WORLD_LOCAL_RANK,
// MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID), else its world rank: which GPU it takes.
int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* x = std::getenv(v); x && *x) return std::atoi(x);
  return dist::world().rank();
}

// The checkpointer's view of a LoRA run: the base's weights are loaded by load_lora_weights, so
// the checkpointer only resumes (or saves) the adapters.
config::JobConfig lora_checkpoint_config(config::JobConfig c) {
  c.checkpoint.initial_load_path.clear();
  c.checkpoint.initial_load_in_hf = false;
  return c;
}

}  // namespace

// The trainer is built one component at a time, in this order: the device and the parallel
// layout, the data, the model (after the memory plan), the optimizer state, the weights (resumed,
// loaded or initialized), and the schedule.
Trainer::Trainer(const config::JobConfig& cfg, std::vector<std::string> docs) : cfg_(cfg) {
  ckpt::check_dump_folder(cfg_);
  config::validate(cfg_);
  setup_parallelism();
  const auto& t = cfg_.training;
  const std::string& device = t.device;
  models::BuildOptions bo = build_options();
  const std::unique_ptr<models::Model> shape = models::build_model(cfg_, bo);
  const ops::Backend& backend = ops::backend(
      device, dtype_op_name(t.mixed_precision_param == "bfloat16" ? DType::BF16 : DType::F32));
  opt_ = &optim::kernels(device);
  const int64_t dp = dims_.batch();  // data-parallel degree: ranks reading different data
  const int64_t global = t.global_batch_size == -1 ? t.local_batch_size * dp : t.global_batch_size;
  check(global % (t.local_batch_size * dp) == 0,
        "training.global_batch_size must be a multiple of local_batch_size × data-parallel degree");
  grad_accum_ = global / (t.local_batch_size * dp);

  build_data(std::move(docs), shape->vocab_size());
  build_model(*shape, bo, backend);
  build_optimizer_state(backend);
  const std::optional<ckpt::TrainState> loaded = load_weights(bo.seed);
  if (t.dtype == "bfloat16") {  // the projections' masters become their bf16 copy, unit by unit
    release_masters();
    if (rank0())
      log::info(
          "Master weights: bf16 for the projections (updated with stochastic rounding), "
          "fp32 for the norms, the embedding and the MoE experts (training.dtype "
          "bfloat16)");
  }
  if (tp_) find_replicated();
  log_layout();
  if (const auto& st = loaded) {
    resumed_ = true;
    step_ = st->step;
    tokens_seen_ = st->tokens_seen;
    if (!st->finished) resume_data(*st);
  }
  if (cfg_.dpo.enable) dpo_reference();
  first_step_ = step_;
  const int64_t step_tokens = grad_accum_ * t.local_batch_size * t.seq_len;
  input_.resize(step_tokens);  // whole rows as read; under CP split in place to this rank's
  labels_.resize(step_tokens);
  positions_.resize(step_tokens);

  adamw_.lr = static_cast<float>(cfg_.optimizer.lr);
  adamw_.beta1 = static_cast<float>(cfg_.optimizer.beta1);
  adamw_.beta2 = static_cast<float>(cfg_.optimizer.beta2);
  adamw_.eps = static_cast<float>(cfg_.optimizer.eps);
  adamw_.weight_decay = static_cast<float>(cfg_.optimizer.weight_decay);
  sched_.total_steps = t.steps;
  if (cfg_.lr_scheduler.warmup_steps > t.steps)
    log::warn("lr_scheduler.warmup_steps (" + std::to_string(cfg_.lr_scheduler.warmup_steps) +
              ") exceeds training.steps; clamped to " + std::to_string(t.steps));
  sched_.warmup_steps = std::min(cfg_.lr_scheduler.warmup_steps, t.steps);
  if (cfg_.lr_scheduler.decay_ratio >= 0) sched_.decay_ratio = cfg_.lr_scheduler.decay_ratio;
  sched_.decay_type = cfg_.lr_scheduler.decay_type;
  sched_.min_lr_factor = cfg_.lr_scheduler.min_lr_factor;
  if (cfg_.optimizer.early_step_in_backward) setup_step_in_backward();
}

// optimizer.early_step_in_backward: the updates made unit by unit in the backward
// (train/step_in_backward.h), installed as the model's parameter hooks (under FSDP called by
// Fsdp as each unit's block is reduced), with torchtitan's refusals (expert parallelism,
// gradient accumulation) and its skipped clipping said once.
void Trainer::setup_step_in_backward() {
  const std::string why =
      "optimizer.early_step_in_backward updates each unit as soon as the "
      "backward finishes its gradient";
  check(dims_.ep <= 1,
        "Optimizers in backward is not supported with Expert Parallel (parallelism."
        "expert_parallel_degree " +
            std::to_string(dims_.ep) + "); turn optimizer.early_step_in_backward off");
  check(grad_accum_ == 1,
        why + ", so it cannot accumulate gradients over " + std::to_string(grad_accum_) +
            " microbatches: set training.global_batch_size to local_batch_size × the data-parallel "
            "degree (" +
            std::to_string(cfg_.training.local_batch_size * dims_.batch()) +
            "), or turn early_step_in_backward off");
  check(!cfg_.dpo.enable,
        why +
            ", but DPO runs a backward for each completion of the step's pairs: turn "
            "optimizer.early_step_in_backward off");
  check(model_->frozen_base() == nullptr,
        why + "; a LoRA run keeps its gradients small already: turn early_step_in_backward off");
  step_in_backward_ = std::make_unique<StepInBackward>(
      model_->store(), state_, *opt_, adamw_,
      grad_replicate_ ? grad_replicate_.get() : mesh_.replicate.get(), replicated_);
  if (fsdp_)  // FSDP holds the hooks; each block is updated once reduced
    fsdp_->set_on_reduced([this](int64_t at, int64_t len) {
      fsdp_->update_begin(at, len);  // bf16 masters: widened, updated, rounded back
      step_in_backward_->shard_ready(fsdp_->master(), fsdp_->grad_shard(), at, len);
      fsdp_->update_end(at, len, step_in_backward_->weight_key());
    });
  else
    model_->store().set_hooks(step_in_backward_.get());
  char max_norm[32];
  std::snprintf(max_norm, sizeof max_norm, "%g", cfg_.training.max_norm);
  if (rank0())
    log::warn(why + ", before the global gradient norm is known: training.max_norm (" + max_norm +
              ") is not applied (as in torchtitan); the logged grad_norm is the norm before the "
              "updates");
}

// The device's checks and the parallel layout: the meshes and, on a device, the groups over its
// memory.
void Trainer::setup_parallelism() {
  const std::string& device = cfg_.training.device;
  ops::check_device(device);
  const ops::Device& dev = ops::device(device);
  models::validate_model_config(cfg_);
  dims_ = dist::ParallelDims::from_config(cfg_, dist::world().size());
  if (!dev.host && dist::world().size() > 1) {  // one process per device, collectives over its
    const std::string n = std::to_string(dist::world().size());  // memory (NCCL on GPUs)
    if (!dist::has_device_group(device))
      throw Error(dev.no_collectives.empty()
                      ? "training.device " + device + " trains in one process (" + n +
                            " ranks need collectives over its memory)"
                      : "training.device " + device + " on " + n + " ranks: " + dev.no_collectives);
    if (dev.select) dev.select(local_rank());
  }
  if (cfg_.training.dtype == "bfloat16") {
    const std::string what = "training.dtype bfloat16 (bf16 master weights) ";
    check(dev.host, what + "runs on the CPU only; on " + device +
                        " keep float32 masters with training.mixed_precision_param bfloat16");
    check(cfg_.lora.rank == 0 && cfg_.lora.adapter_path.empty(),
          what +
              "does not apply to LoRA: its frozen base is already kept as the bf16 copy "
              "under training.mixed_precision_param bfloat16; set training.dtype float32");
  }
  if (dims_.cp > 1) {
    const std::string what =
        "parallelism.context_parallel_degree " + std::to_string(dims_.cp) + ": ";
    check(dev.host,
          what + "context parallelism runs on the CPU only (training.device " + device + ")");
    check(static_cast<bool>(models::model_spec(cfg_.model.name).context_parallel),
          what + "model " + cfg_.model.name + " has no context-parallel attention");
    check(!cfg_.dpo.enable, what +
                                "DPO's rows are single completions of varying length; train DPO "
                                "with data parallelism");
    check(cfg_.lora.rank == 0 && cfg_.lora.adapter_path.empty(),
          what +
              "LoRA with context parallelism is not implemented; train the adapters with "
              "data parallelism");
  }
  mesh_ = dist::make_meshes(dims_, dist::world());
  // On a device the gradients, parameters, dispatched rows and activations move over its own
  // collectives (NCCL on GPUs).
  if (!dev.host && dims_.dp_replicate > 1)
    grad_replicate_ = dist::device_group(device, *mesh_.replicate);
  if (!dev.host && dims_.dp_shard > 1) fsdp_group_ = dist::device_group(device, *mesh_.fsdp);
  if (!dev.host && dims_.tp > 1) tp_data_ = dist::device_group(device, *mesh_.tp);
  if (!dev.host && dims_.ep > 1) {  // the dispatched rows; the experts' FSDP over efsdp
    ep_rows_ = dist::device_group(device, *mesh_.ep);
    if (dims_.dp_shard > 1) efsdp_group_ = dist::device_group(device, *mesh_.efsdp);
  }
}

// What to build (module tree -> overrides from --override.imports -> the ops each layer calls ->
// the model): first a plan-only model (parameter list and size table, no storage) for the
// vocabulary and the memory plan, then, once the data is open and the plan fits, the model.
models::BuildOptions Trainer::build_options() const {
  const auto& t = cfg_.training;
  models::BuildOptions bo;
  bo.batch = t.local_batch_size;
  bo.seq_len = t.seq_len;
  bo.cp = dims_.cp;
  bo.loss_chunks = cfg_.loss.num_chunks;
  bo.seed = cfg_.debug.seed >= 0 ? static_cast<uint64_t>(cfg_.debug.seed) : 0;
  bo.ac = models::AcPolicy::from_config(cfg_.activation_checkpoint.mode,
                                        cfg_.activation_checkpoint.selective_ac_option);
  // weights, gradients (but one unit's under early_step_in_backward without FSDP, which keeps
  // its gradient shard), the two AdamW moments, and the bf16 compute copy
  const bool grads_by_unit = cfg_.optimizer.early_step_in_backward && !dims_.sharded();
  // (training.dtype bfloat16: the projections' bf16 copy is their master; the fp32 rest is
  // counted exactly by the memory plan)
  const bool pure_bf16 = t.dtype == "bfloat16";
  bo.bytes_per_param = (pure_bf16 ? 0 : 4) + (grads_by_unit ? 0 : 4) +
                       (cfg_.optimizer.moments_dtype() == "bfloat16" ? 4
                        : cfg_.optimizer.moments_dtype() == "int8"   ? 2
                                                                     : 8) +
                       (t.mixed_precision_param == "bfloat16" ? 2 : 0);
  bo.bytes_hold = grads_by_unit ? "parameters and optimizer state (gradients one unit at a time)"
                                : "parameters, gradients and optimizer state";
  bo.allocate = false;
  bo.log_overrides = false;
  bo.device = cfg_.training.device;
  return bo;
}

// The dataset (text tokenized by dataloader.tokenizer, or token shards), the validator's, and
// the loader of this rank's batches.
void Trainer::build_data(std::vector<std::string> docs, int64_t vocab) {
  const auto& t = cfg_.training;
  if (cfg_.dpo.enable) {  // preference pairs (data/preference.h), not a stream of rows
    const data::DatasetSpec spec = dataloader_spec(cfg_);
    const auto tok = data::make_tokenizer(spec.tokenizer);
    data::PreferenceStats st;
    pairs_ = data::read_preference_pairs(spec.source, *tok, t.seq_len + 1, &st);
    pair_order_ =
        std::make_unique<PairOrder>(static_cast<int64_t>(pairs_.size()), cfg_.dataloader.shuffle,
                                    static_cast<uint64_t>(cfg_.dataloader.seed));
    text_data_ = true;
    for (const auto& p : pairs_)
      for (const auto* v : {&p.prompt, &p.chosen, &p.rejected})
        for (int32_t id : *v)
          check(id >= 0 && id < vocab, "the tokenizer " + spec.tokenizer + " made id " +
                                           std::to_string(id) + " but model.vocab_size is " +
                                           std::to_string(vocab));
    if (rank0())
      log::info("DPO: " + with_commas(static_cast<int64_t>(pairs_.size())) +
                " preference pairs from " + data::source_path(spec.source) +
                (st.truncated > 0
                     ? "; " + with_commas(st.truncated) + " cut to training.seq_len + 1 tokens"
                     : "") +
                (st.dropped_long > 0 ? "; " + with_commas(st.dropped_long) +
                                           " whose prompt alone fills training.seq_len + 1 "
                                           "tokens left out (first " +
                                           st.first_dropped + ")"
                                     : "") +
                (st.bad_records > 0 ? "; " + with_commas(st.bad_records) +
                                          " malformed records skipped (first " + st.first_bad + ")"
                                    : ""));
    return;
  }
  // Text files are read in place through an index kept in the dump folder (text_corpus.h).
  const std::string index_dir = cfg_.dump_folder + "/dataset_index";
  data::DatasetSpec spec = dataloader_spec(cfg_);
  spec.index_dir = index_dir;
  // Rank 0 indexes new files first; the other ranks then reuse the index it saved instead of
  // each reading the whole corpus again.
  if (!rank0()) dist::world().barrier();
  std::shared_ptr<const data::DocumentSet> dataset =
      docs.empty() ? data::open_dataset(spec)
                   : std::make_shared<data::TextDocuments>(
                         std::move(docs), data::make_tokenizer(resolved_tokenizer(cfg_)));
  if (rank0()) dist::world().barrier();
  check_vocab_fits(*dataset, vocab);
  const auto* chat = dynamic_cast<const data::ChatDocuments*>(dataset.get());
  // Whether dataloader.tokenizer made the ids (not token shards alone): then a resume checks it.
  const auto tokenized = [](const data::DocumentSet* d) {
    return dynamic_cast<const data::TokenDocuments*>(d) == nullptr;
  };
  text_data_ = tokenized(dataset.get());
  if (const auto* mix = dynamic_cast<const data::MixedDocuments*>(dataset.get())) {
    text_data_ = false;
    for (const auto& s : mix->sources()) text_data_ = text_data_ || tokenized(s.get());
  }
  if (cfg_.validator.enable) {
    data::DatasetSpec vs = validator_spec(cfg_);
    vs.index_dir = index_dir;
    if (auto* text = dynamic_cast<const data::TextDocuments*>(dataset.get()))
      vs.loaded = text->tokenizer();  // load the tokenizer once
    if (chat) vs.loaded = chat->tokenizer();
    auto vdocs = data::open_dataset(vs);
    check_vocab_fits(*vdocs, vocab);
    validator_ = std::make_unique<Validator>(cfg_, std::move(vdocs));
  }
  data::LoaderOptions lo;
  lo.batch = t.local_batch_size;
  lo.seq_len = t.seq_len;
  lo.shuffle = cfg_.dataloader.shuffle;
  lo.seed = static_cast<uint64_t>(cfg_.dataloader.seed);
  // One global stream of packed rows, the same on every rank: the data of step k depends on the
  // dataset, the seed and k alone, not on the layout (step() takes this rank's rows of it).
  lo.dp_rank = 0;
  lo.dp_world = 1;
  loader_ = std::make_unique<data::PackedLoader>(std::move(dataset), lo);
}

// The memory plan, then the model (this rank's slice of the layout), its tensor-parallel hooks
// and, for LoRA, the frozen base's weights.
void Trainer::build_model(const models::Model& shape, models::BuildOptions bo,
                          const ops::Backend& backend) {
  // Before anything large is allocated: refuse what cannot fit.
  const tools::MemoryPlan plan = tools::plan_memory(cfg_, shape, dims_);
  tools::check_fits(plan);
  std::istringstream lines(plan.format());
  for (std::string line; std::getline(lines, line);) log::info(line);
  bo.allocate = bo.log_overrides = true;
  if (dims_.ep > 1) {  // the dispatch around each MoE layer's experts op, over the EP group
    ep_buffers_ = parallel::dispatch_buffers();
    bo.wrap_experts = [this](ops::GroupedExpertsOp op) {
      return parallel::expert_parallel(std::move(op), *mesh_.ep, ep_buffers_, ep_rows_.get());
    };
  }
  bo.init = !dims_.sharded();  // FSDP initializes unit by unit (below), never the whole model
  if (dims_.tp > 1) {          // this rank's slice of the tensor-parallel layout
    check(cfg_.lora.rank == 0 && cfg_.lora.adapter_path.empty(),
          "LoRA with tensor parallelism (parallelism.tensor_parallel_degree > 1) is not "
          "implemented; train the adapters with data parallelism instead");
    bo.tp = {static_cast<int>(mesh_.tp_rank), static_cast<int>(dims_.tp), dims_.sp};
  }
  if (dims_.ep > 1) {  // this rank's experts alone (torchtitan shards them over the ep ranks)
    bo.tp.ep_rank = mesh_.ep->rank();
    bo.tp.ep_size = static_cast<int>(dims_.ep);
  }
  bo.sharded = dims_.sharded();  // FSDP: on a GPU the flat buffers take memory unit by unit
  model_ = models::build_model(cfg_, bo);
  if (dims_.tp > 1) {
    tp_ = std::make_unique<parallel::TensorParallel>(*mesh_.tp, tp_data_.get(), backend.memory());
    models::model_spec(cfg_.model.name).parallelize(*model_, tp_.get());
  }
  if (dims_.cp > 1) {  // attention across the chunks of each row (models/context_parallel.h)
    cp_ = std::make_unique<parallel::ContextParallel>(*mesh_.cp);
    models::model_spec(cfg_.model.name)
        .context_parallel(*model_, models::ContextAttention(cp_->slice(), cp_.get()));
  }
  const bool lora = model_->frozen_base() != nullptr;
  check(!lora || !dims_.sharded(),
        "LoRA with FSDP (parallelism.data_parallel_shard_degree > 1) is not implemented; train "
        "the adapters with data_parallel_replicate_degree (DDP) instead");
  if (lora) {
    load_lora_weights(cfg_, *model_);
    model_->frozen_base()->store().release_masters();
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "LoRA: rank %lld, alpha %g, targets %s: %s trainable parameters (%.3f%% of the "
                  "%s frozen)",
                  static_cast<long long>(model_->params()[0].shape[0]), cfg_.lora.alpha,
                  cfg_.lora.target_modules.c_str(), with_commas(model_->num_params()).c_str(),
                  100.0 * static_cast<double>(model_->num_params()) /
                      static_cast<double>(models::frozen_weights(*model_)),
                  with_commas(models::frozen_weights(*model_)).c_str());
    log::info(buf);
  }
}

// FSDP: this rank's shard of every unit (parallel/fsdp.h) and its AdamW state; else everything.
void Trainer::build_optimizer_state(const ops::Backend& backend) {
  const auto& t = cfg_.training;
  const int64_t n = model_->num_params();
  if (dims_.sharded())
    fsdp_ = std::make_unique<parallel::Fsdp>(
        *model_, backend, fsdp_group_ ? *fsdp_group_ : *mesh_.fsdp,
        cfg_.parallelism.fsdp_reshard_after_forward, t.mixed_precision_param == "bfloat16",
        dims_.ep > 1 ? (efsdp_group_ ? efsdp_group_.get() : mesh_.efsdp.get()) : nullptr);
  const int64_t shard_len = fsdp_ ? fsdp_->shard_len() : n;
  const DType dtype = optim::state_dtype(cfg_.optimizer.moments_dtype());
  optim::check_kernels_for(*opt_, dtype);  // refused before anything is allocated
  // Where each parameter, or the piece of one this rank's shard holds, starts in the state (the
  // 8-bit blocks start there).
  std::vector<int64_t> starts;
  if (dtype == DType::I8) {
    const ckpt::Segments whole{{0, n}};
    int64_t at = 0;
    for (const auto& seg : fsdp_ ? fsdp_->own_segments() : whole) {
      for (const auto& p : model_->params()) {
        const int64_t b = std::max(p.offset, seg.begin);
        if (!p.alias && b < std::min(p.offset + p.numel, seg.begin + seg.len))
          starts.push_back(at + b - seg.begin);
      }
      at += seg.len;
    }
    std::sort(starts.begin(), starts.end());
  }
  state_ = optim::AdamWState(dtype, shard_len, backend.memory(), starts);
}

// The checkpointer, and the weights: a resumed checkpoint, initial weights, or the seeded init.
std::optional<ckpt::TrainState> Trainer::load_weights(uint64_t seed) {
  const bool lora = model_->frozen_base() != nullptr;
  checkpointer_ = std::make_unique<ckpt::Checkpointer>(lora ? lora_checkpoint_config(cfg_) : cfg_);
  std::optional<ckpt::TrainState> loaded;
  // Loading also clears what an interrupted save left behind: rank 0 does that first, the other
  // ranks read after it.
  if (!rank0()) dist::world().barrier();
  // Any checkpoint layout: the whole parameters, the optimizer state of this rank's shard.
  // FSDP: a resumed checkpoint is read unit by unit, each unit's block kept as it arrives.
  ckpt::UnitDone take_unit;
  if (fsdp_) take_unit = [this](int64_t u) { fsdp_->take_unit(u); };
  const auto& k = cfg_.checkpoint;
  const bool initial = !k.initial_load_path.empty() || k.initial_load_in_hf;
  // A tensor/expert-parallel model reads only its slices of the whole tensors of any layout,
  // from a checkpoint or initial weights.
  {
    HostMoments hm(*this);  // off the CPU: read on the host, then sent
    loaded = checkpointer_->load(*model_, hm.moments(),
                                 fsdp_ ? fsdp_->own_segments() : ckpt::Segments{}, take_unit);
    if (loaded) hm.send();
  }
  const std::string state_dtype = cfg_.optimizer.moments_dtype();
  if (loaded && !loaded->finished &&
      (loaded->optimizer_state_dtype.empty() ? "float32" : loaded->optimizer_state_dtype) !=
          state_dtype &&
      rank0())
    log::warn("the checkpoint's AdamW moments are " +
              (loaded->optimizer_state_dtype.empty() ? std::string("float32")
                                                     : loaded->optimizer_state_dtype) +
              "; this run keeps them in " + state_dtype +
              " (optimizer.state_dtype): converted, so the resume is not bitwise");
  if (!loaded && !initial)
    log::info("Weights: random init with seed " + std::to_string(seed) +
              " (nothing to resume or load; a published model: --model.hf_assets_path DIR "
              "--checkpoint.initial_load_in_hf)");
  if (rank0()) dist::world().barrier();
  if (fsdp_) {  // resumed: taken unit by unit; initial weights: read (HF: only the rank's
                // slices), then sharded
    if (!loaded && initial)
      fsdp_->take_params_from_model();
    else if (!loaded)
      fsdp_->init_unit_by_unit(seed);
    model_->store().set_hooks(fsdp_.get());
  }
  return loaded;
}

// Tensor parallelism: the replicated parameters' ranges in the optimizer's buffer, for the norm.
void Trainer::find_replicated() {
  const int64_t n = model_->num_params();
  std::vector<models::FlatRange> mine;
  int64_t at = 0;
  const ckpt::Segments all{{0, n}};
  for (const auto& seg : fsdp_ ? fsdp_->own_segments() : all) {
    for (const auto& p : model_->params()) {
      if (p.alias || p.split_dim >= 0) continue;
      const int64_t lo = std::max(p.offset, seg.begin),
                    hi = std::min(p.offset + p.numel, seg.begin + seg.len);
      if (lo < hi) mine.push_back({at + lo - seg.begin, hi - lo});
    }
    at += seg.len;
  }
  std::sort(mine.begin(), mine.end(), [](const models::FlatRange& a, const models::FlatRange& b) {
    return a.begin < b.begin;
  });
  replicated_ = std::move(mine);
}

// One line per parallelism: what this rank holds and runs.
void Trainer::log_layout() const {
  const int64_t n = model_->num_params();
  const int64_t shard_len = fsdp_ ? fsdp_->shard_len() : n;
  if (cp_)
    log::info("Context parallelism: CP " + std::to_string(dims_.cp) + ", each row's " +
              std::to_string(cfg_.training.seq_len) + " tokens cut into " +
              std::to_string(2 * dims_.cp) + " chunks of " +
              std::to_string(cfg_.training.seq_len / (2 * dims_.cp)) +
              ", this rank holding chunks " + std::to_string(mesh_.cp_rank) + " and " +
              std::to_string(2 * dims_.cp - 1 - mesh_.cp_rank) +
              " (head-tail); keys and values all-gathered over the group in each attention");
  if (dims_.batch() > 1 || dims_.sharded())
    log::info("Data parallelism: " + dims_.describe() + " over " +
              std::to_string(dist::world().size()) + " ranks (" + dist::world().backend() +
              "); this rank's master weights, gradients and AdamW state: " +
              with_commas(shard_len) + " of " + with_commas(n) + " parameters" +
              (fsdp_ ? ", parameters gathered unit by unit (reshard_after_forward " +
                           cfg_.parallelism.fsdp_reshard_after_forward + ")"
                     : std::string()));
  if (tp_) {
    const models::ShardRange v =
        models::shard_range(model_->vocab_size(), mesh_.tp_rank, static_cast<int>(dims_.tp));
    log::info("Tensor parallelism: TP " + std::to_string(dims_.tp) + " over ranks " +
              std::to_string(dist::world().rank() - mesh_.tp_rank) + ".." +
              std::to_string(dist::world().rank() - mesh_.tp_rank + dims_.tp - 1) +
              (dims_.sp ? ", sequence parallel (the residual stream on 1/" +
                              std::to_string(dims_.tp) + " of the tokens)"
                        : ", sequence parallelism off") +
              ", loss parallel (vocabulary rows [" + std::to_string(v.begin) + ", " +
              std::to_string(v.begin + v.rows) + ") here" +
              (cfg_.parallelism.disable_loss_parallel
                   ? "; disable_loss_parallel is set, but titan computes the same loss without "
                     "gathering the logits"
                   : "") +
              "); this rank holds " + with_commas(n) + " parameters (its slices, " +
              (dims_.ep > 1 ? "its experts " : "") + "and the replicated norms)");
  }
  if (dims_.ep > 1) {
    int64_t E = 0;
    for (const auto& q : model_->params())
      if (q.tp == models::ParamInfo::Tp::experts) E = q.shape[0];
    const int64_t El = E / dims_.ep, r = mesh_.ep->rank();
    const int64_t groups = dist::world().size() / dims_.ep;
    log::info("Expert parallelism: EP " + std::to_string(dims_.ep) + " (" + std::to_string(groups) +
              (groups == 1 ? " group" : " groups") + "); this rank holds and runs experts [" +
              std::to_string(r * El) + ", " + std::to_string((r + 1) * El) +
              ") of every MoE layer on the tokens routed to them by its group (all-to-all), " +
              (fsdp_ ? "sharded over " + std::to_string(mesh_.efsdp->size()) + " rank(s) (efsdp)"
                     : std::string("unsharded")));
  }
}

Trainer::HostMoments::HostMoments(Trainer& tr, bool fetch)
    : t(tr), m(tr.state_.m()), v(tr.state_.v()), master(tr.fsdp_ ? tr.fsdp_->master() : nullptr) {
  const DeviceMemory& mem = t.state_.memory();
  if (mem.host()) return;
  const int64_t n = t.state_.size();
  if (t.state_.dtype() != DType::I8) {  // int8: the codec copies what it reads or writes
    const size_t bytes = dtype_size(t.state_.dtype()) * static_cast<size_t>(n);
    hm.resize(static_cast<int64_t>(bytes));
    hv.resize(static_cast<int64_t>(bytes));
    m = hm.data();
    v = hv.data();
    if (fetch) {
      mem.copy(m, t.state_.m(), bytes);
      mem.copy(v, t.state_.v(), bytes);
    }
  }
  if (!master || !fetch) {
    master = nullptr;
    return;
  }
  hp.resize(n);
  mem.copy(hp.data(), master, sizeof(float) * static_cast<size_t>(n));
  master = hp.data();
}

void Trainer::HostMoments::send() {
  const DeviceMemory& mem = t.state_.memory();
  if (mem.host() || t.state_.dtype() == DType::I8) return;
  mem.copy(t.state_.m(), m, static_cast<size_t>(hm.size()));
  mem.copy(t.state_.v(), v, static_cast<size_t>(hv.size()));
}

models::Model& Trainer::whole_model() {
  if (!whole_) {  // weights only: one token of activations, no gradients
    models::BuildOptions o;
    o.batch = o.seq_len = o.loss_chunks = 1;
    o.init = false;
    o.bytes_per_param = 0;
    o.log_overrides = false;
    o.trainable = false;
    whole_ = models::build_model(cfg_, o);
  }
  return *whole_;
}

void Trainer::export_sliced(const ckpt::TrainState& st, bool last) {
  models::Model& w = whole_model();
  const models::Model& local = *model_;
  if (fsdp_) fsdp_->gather_all();  // this rank's slice whole
  parallel::TensorParallel::gather(*mesh_.tp, *mesh_.ep, local, local.store().param_data(), w,
                                   w.store().param_data());
  parallel::TensorParallel::copy_buffers(local, w);
  if (fsdp_) fsdp_->reshard_all();
  if (rank0()) checkpointer_->maybe_save(st, last, w, ckpt::Moments{});
  whole_.reset();
}

StepResult Trainer::step() {
  StepResult r;
  auto dp_sent = [this] {  // the gradients' and parameters' collectives (experts: efsdp's)
    return mesh_.fsdp->bytes_sent() + mesh_.replicate->bytes_sent() + mesh_.efsdp->bytes_sent() +
           (grad_replicate_ ? grad_replicate_->bytes_sent() : 0) +
           (fsdp_group_ ? fsdp_group_->bytes_sent() : 0) +
           (efsdp_group_ ? efsdp_group_->bytes_sent() : 0);
  };
  const int64_t sent0 = dp_sent();
  auto ep_sent = [this] {
    return mesh_.ep->bytes_sent() + (ep_rows_ ? ep_rows_->bytes_sent() : 0);
  };
  auto tp_sent = [this] {
    return mesh_.tp->bytes_sent() + (tp_data_ ? tp_data_->bytes_sent() : 0);
  };
  const int64_t ep0 = ep_sent(), tp0 = tp_sent(), cp0 = mesh_.cp->bytes_sent();
  const double tp_t0 = tp_ ? tp_->seconds() : 0.0, cp_t0 = cp_ ? cp_->seconds() : 0.0;
  const parallel::DispatchSeconds ep_t0 =
      ep_buffers_ ? parallel::dispatch_seconds(*ep_buffers_) : parallel::DispatchSeconds{};
  r.lr = cfg_.optimizer.lr * sched_.factor(step_);  // the LR this step uses
  if (step_in_backward_)
    step_in_backward_->begin_step(static_cast<float>(r.lr), step_ + 1, rounding_key(step_ + 1),
                                  rounding_key(step_ + 1, /*weights=*/true));
  if (fsdp_)
    fsdp_->begin_step();        // the model's gradients are already zero (given back by each unit)
  else if (!step_in_backward_)  // (each unit's gradient was given back after its update)
    model_->zero_grad();

  if (cfg_.dpo.enable) {
    dpo_microbatches(r);
  } else {
    text_microbatches(r);
  }
  reduce_and_update(r);
  step_comm_bytes_ += dp_sent() - sent0;
  ep_comm_bytes_ += ep_sent() - ep0;
  tp_comm_bytes_ += tp_sent() - tp0;
  if (tp_) tp_seconds_ += tp_->seconds() - tp_t0;
  cp_comm_bytes_ += mesh_.cp->bytes_sent() - cp0;
  if (cp_) cp_seconds_ += cp_->seconds() - cp_t0;
  if (ep_buffers_) {
    const parallel::DispatchSeconds t1 = parallel::dispatch_seconds(*ep_buffers_);
    ep_seconds_.exchange += t1.exchange - ep_t0.exchange;
    ep_seconds_.experts += t1.experts - ep_t0.experts;
  }
  return r;
}

// The next-token objective's part of a step: this rank's microbatches of the one global stream,
// forward and backward, the loss and the MoE statistics summed over the data-parallel ranks.
void Trainer::text_microbatches(StepResult& r) {
  const auto& t = cfg_.training;
  const int64_t mb_tokens = t.local_batch_size * t.seq_len;
  // Pull every microbatch first and count the valid tokens of the whole step. The step's global
  // batch is microbatches m = 0 .. grad_accum × dp − 1 of the one stream; data rank r trains
  // m = a·dp + r for a = 0 .. grad_accum − 1 and reads past the others' (so one process with
  // accumulation and any data-parallel layout of the same global batch see the same rows).
  const double t0 = cpu::now_seconds();
  const int64_t dp = dims_.batch();
  for (int64_t a = 0; a < grad_accum_; ++a)
    for (int64_t q = 0; q < dp; ++q) {
      const bool mine = q == mesh_.batch_rank;
      if (!mine) skip_.resize(static_cast<size_t>(3 * mb_tokens));
      int32_t *in = mine ? input_.data() + a * mb_tokens : skip_.data(),
              *lab = mine ? labels_.data() + a * mb_tokens : skip_.data() + mb_tokens,
              *pos = mine ? positions_.data() + a * mb_tokens : skip_.data() + 2 * mb_tokens;
      loader_->next(in, lab, pos);
    }
  // Context parallelism: each microbatch's rows cut to this rank's chunks, packed at the front
  // (microbatch a at a·mb_local).
  const int64_t seq = t.seq_len / dims_.cp, mb_local = t.local_batch_size * seq;
  if (cp_)
    for (int64_t a = 0; a < grad_accum_; ++a)
      for (Buffer<int32_t>* v : {&input_, &labels_, &positions_}) {
        cp_rows_.assign(v->data() + a * mb_tokens, v->data() + (a + 1) * mb_tokens);
        parallel::split_rows(cp_rows_.data(), t.local_batch_size, t.seq_len, cp_->slice(),
                             v->data() + a * mb_local);
      }
  data_time_ = cpu::now_seconds() - t0;
  int64_t valid = 0;
  for (int64_t i = 0; i < grad_accum_ * mb_local; ++i) valid += labels_[i] != ops::kIgnoreIndex;
  mesh_.batch->all_reduce(&valid, 1);  // torchtitan: the global valid-token count, before forward
  r.valid_tokens = valid;
  const float scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;

  // The auxiliary loss of each microbatch (Transformers' statistics over its tokens); the step's
  // term is the mean over every microbatch of every data-parallel rank, as one process with
  // the same microbatches accumulated has it.
  const int64_t microbatches = grad_accum_ * dims_.batch();
  double loss_sum = 0, aux_sum = 0;
  const float aux_weight = 1.0f / static_cast<float>(microbatches);
  const models::RoutingStats* routing = model_->routing();
  for (int64_t a = 0; a < grad_accum_; ++a) {
    models::Batch b{t.local_batch_size, seq, input_.data() + a * mb_local,
                    labels_.data() + a * mb_local, positions_.data() + a * mb_local};
    loss_sum += model_->forward_backward(b, scale, aux_weight).sum;
    if (routing) aux_sum += routing->last_aux_loss();
  }
  test::kill_point("step:backward");
  mesh_.batch->all_reduce(&loss_sum, 1);
  tokens_seen_ += grad_accum_ * mb_tokens * dims_.batch();
  r.loss = valid > 0 ? loss_sum / static_cast<double>(valid) : std::nan("");
  reduce_routing(r, aux_sum, microbatches * dims_.cp);  // the cp ranks of a row agree on it
  r.tokens = grad_accum_ * mb_local;
}

// MoE: the step's auxiliary loss (the mean of aux_sum, this rank's per-pass values, over the
// passes of every data-parallel rank) added to the loss, and the expert counts summed over the
// ranks (before finish_step's expert-bias update) and logged.
void Trainer::reduce_routing(StepResult& r, double aux_sum, int64_t passes) {
  const models::RoutingStats* routing = model_->routing();
  mesh_.batch->all_reduce(&aux_sum, 1);
  if (const auto coef = routing ? routing->aux_loss_coef() : std::nullopt) {
    r.aux_loss = aux_sum / static_cast<double>(passes);
    r.loss += *coef * r.aux_loss;
  }
  for (const auto& load : routing ? routing->expert_load() : std::vector<models::ExpertLoad>{}) {
    mesh_.batch->all_reduce(load.tokens->data(), static_cast<int64_t>(load.tokens->size()));
    // EP over the tp ranks: each routed its own rows (Qwen3Model::moe_local).
    if (dims_.tp > 1 && dims_.ep > 1)
      mesh_.tp->all_reduce(load.tokens->data(), static_cast<int64_t>(load.tokens->size()));
    r.expert_load.push_back({load.layer,
                             *std::min_element(load.tokens->begin(), load.tokens->end()),
                             *std::max_element(load.tokens->begin(), load.tokens->end())});
  }
}

// The DPO objective's part of a step. The step's global batch is pairs k = 0 .. N − 1 (N =
// grad_accum × local_batch_size × dp) at positions step · N + k of the pairs' order (PairOrder:
// the file's, reshuffled each epoch after the first with dataloader.shuffle). Data rank q trains
// the pairs of microbatches m = a·dp + q, as the next-token objective splits its rows, so every
// layout of the same global batch sees the same pairs. The reference: the base without its adapters
// (LoRA), else the starting weights' saved log-probabilities.
void Trainer::dpo_microbatches(StepResult& r) {
  const int64_t lbs = cfg_.training.local_batch_size, dp = dims_.batch();
  const int64_t N = grad_accum_ * lbs * dp;
  const bool lora = model_->frozen_base() != nullptr;
  std::vector<data::PreferencePair> mine;
  std::vector<PairLogps> ref;
  for (int64_t k = 0; k < N; ++k) {
    if ((k / lbs) % dp != mesh_.batch_rank) continue;
    const int64_t i = pair_order_->at(step_ * N + k);
    mine.push_back(pairs_[static_cast<size_t>(i)]);
    if (lora) {
      struct AdaptersOff {  // on again however the pass ends
        models::Model& m;
        ~AdaptersOff() { m.set_adapters_enabled(true); }
      } off{*model_};
      model_->set_adapters_enabled(false);
      ref.push_back(pair_logps(*model_, mine.back(), dpo_pad_to()));
    } else {
      ref.push_back(ref_logps_[static_cast<size_t>(i)]);
    }
  }
  data_time_ = 0;
  DpoSums s = dpo_forward_backward(*model_, cfg_.dpo, mine, ref, N, dpo_pad_to());
  r.tokens = s.tokens;
  // the sums over the data-parallel ranks (the aux loss: reduce_routing)
  double* sum[] = {&s.loss,   &s.reward_chosen, &s.reward_rejected, &s.accurate,
                   &s.margin, &s.logps_chosen,  &s.logps_rejected};
  double all[9];
  for (int i = 0; i < 7; ++i) all[i] = *sum[i];
  all[7] = static_cast<double>(s.tokens);
  all[8] = static_cast<double>(s.completion_tokens);
  mesh_.batch->all_reduce(all, 9);
  for (int i = 0; i < 7; ++i) *sum[i] = all[i];
  s.tokens = static_cast<int64_t>(all[7]);
  s.completion_tokens = static_cast<int64_t>(all[8]);
  s.pairs = N;
  r.loss = s.loss / static_cast<double>(N);
  reduce_routing(r, s.aux_loss, 2 * N);  // one pass per completion
  r.valid_tokens = s.completion_tokens;
  r.objective = s.metrics();
  tokens_seen_ += s.tokens;
}

// The reference log-probabilities for full fine-tuning: at step 0 every pair the run will see is
// run through the starting weights (shared over the data-parallel ranks) and the result saved in
// DUMP_FOLDER/dpo_reference/logps.bin; a resumed run reads them back. LoRA needs none.
void Trainer::dpo_reference() {
  if (model_->frozen_base()) return;  // LoRA
  const std::string path = cfg_.dump_folder + "/dpo_reference/logps.bin";
  // The pairs the run sees: positions 0 .. steps · N − 1, the first epoch in the file's order.
  const int64_t N = grad_accum_ * cfg_.training.local_batch_size * dims_.batch();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(pairs_.size()), cfg_.training.steps * N);
  if (step_ > 0) {
    ref_logps_ = load_reference_logps(path, pairs_);
    check(static_cast<int64_t>(ref_logps_.size()) >= n,
          path +
              " holds the reference of fewer pairs than this run trains on (training.steps "
              "or the batch grew); start again from step 0 in another dump_folder");
    return;
  }
  const double t0 = cpu::now_seconds();
  ref_logps_ = reference_logps(*model_, pairs_, n, mesh_.batch_rank, dims_.batch(), dpo_pad_to());
  mesh_.batch->all_reduce(reinterpret_cast<double*>(ref_logps_.data()), 2 * n);
  if (rank0()) {
    std::filesystem::create_directories(cfg_.dump_folder + "/dpo_reference");
    save_reference_logps(path, pairs_, ref_logps_);
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", cpu::now_seconds() - t0);
    log::info("DPO: reference log-probabilities of " + with_commas(n) +
              " pairs from the starting weights in " + secs + ", saved in " + path);
  }
  dist::world().barrier();
}

// Sequence parallelism splits each row's tokens over the tp ranks: rows padded to a multiple.
int64_t Trainer::dpo_pad_to() const { return dims_.tp; }

void Trainer::reduce_and_update(StepResult& r) {
  // Gradients all-reduced across replicas (DDP: everything; FSDP/HSDP: the shard reduce-scattered
  // within the replica during the backward; one process: nothing moves). Updated in the
  // backward (early_step_in_backward): already reduced and applied unit by unit.
  if (fsdp_) fsdp_->finish_grads();
  const int64_t len = fsdp_ ? fsdp_->shard_len() : model_->num_params();
  float* shard_grad = fsdp_ ? fsdp_->grad_shard() : model_->store().grads();
  // (skipped for a group of one: the gradients may be device memory, which MPI must not see)
  if (mesh_.replicate->size() > 1 && !step_in_backward_)
    (grad_replicate_ ? *grad_replicate_ : *mesh_.replicate).all_reduce(shard_grad, len);
  // Σ g² of this rank's elements: under TP [slices, replicated]; the slices' sums add over the
  // tp ranks, the replicated parameters (the same on every tp rank) count once.
  double sq[2] = {0, 0};
  int64_t not_updated = 0;  // early_step_in_backward: ranks that stopped at a non-finite unit
  if (step_in_backward_) {
    sq[0] = step_in_backward_->sum_squares()[0];
    sq[1] = step_in_backward_->sum_squares()[1];
    not_updated = step_in_backward_->failed();
    dist::world().all_reduce(&not_updated, 1);
  } else {
    add_sum_squares(*opt_, shard_grad, 0, len, replicated_, sq);
  }
  mesh_.fsdp->all_reduce(sq, 2);
  if (tp_) mesh_.tp->all_reduce(sq, 1);
  r.grad_norm = not_updated ? std::nan("") : std::sqrt(sq[0] + sq[1]);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  step_in_backward_
                      ? "step %lld: loss %g, grad_norm %g is not finite; with "
                        "optimizer.early_step_in_backward the units the backward finished "
                        "before the first non-finite gradient were updated, the rest not"
                      : "step %lld: loss %g, grad_norm %g is not finite; stopped before the "
                        "optimizer update",
                  static_cast<long long>(step_ + 1), r.loss, r.grad_norm);
    // Before blaming the learning rate: are the weights themselves bad, or is this the first
    // step of the run (no update yet)?
    if (fsdp_) fsdp_->gather_all();   // on every rank: the norm agreed
    model_->store().widen_masters();  // bf16 masters: read as fp32
    const std::string bad = describe_nonfinite_weights(*model_);
    const std::string origin = resumed_ ? "the checkpoint resumed at step " +
                                              std::to_string(first_step_) + " (in " +
                                              checkpointer_->folder() + ")"
                                        : initial_weights_source(cfg_);
    std::string why;
    if (!bad.empty() && step_ == first_step_)
      why = "the initial weights from " + origin + " hold " + bad + "; check them";
    else if (!bad.empty())
      why = "the weights hold " + bad + " after " + std::to_string(step_ - first_step_) +
            " update(s) (lower optimizer.lr or check the data)";
    else if (step_ == first_step_)
      why = "the initial weights from " + origin +
            " give a non-finite loss before any update; check them (and the data)";
    else
      why = "lower optimizer.lr or check the data";
    if (step_ != first_step_ && cfg_.optimizer.eps == 0)
      why +=
          "; optimizer.eps is 0, so a weight whose gradient and moments are exactly 0 is "
          "updated by 0/0 = NaN: give a positive optimizer.eps (the default is 1e-8)";
    throw Error(std::string(msg) + ": " + why);
  }
  if (!step_in_backward_) opt_->clip_by_norm(shard_grad, len, r.grad_norm, cfg_.training.max_norm);
  model_->finish_step();  // MoE expert-bias update (torchtitan's optimizer pre-step hook)
  ++step_;
  if (step_in_backward_) {
    if (fsdp_) fsdp_->reshard_all();  // the masters changed in the backward
    return;
  }
  models::ParamStore& store = model_->store();
  const float lr = static_cast<float>(r.lr);
  if (fsdp_ && fsdp_->masters_released()) {  // bf16 masters: widened, updated, rounded per block
    int64_t at = 0;
    for (const auto& seg : fsdp_->own_segments()) {
      fsdp_->update_begin(at, seg.len);
      state_.step_range(*opt_, fsdp_->master(), shard_grad, at, seg.len, adamw_, lr, step_,
                        rounding_key(step_));
      fsdp_->update_end(at, seg.len, rounding_key(step_, /*weights=*/true));
      at += seg.len;
    }
    fsdp_->reshard_all();
    return;
  }
  if (store.masters_released()) {  // the same per unit
    for (size_t u = 0; u < store.units().size(); ++u) {
      const models::ParamUnit& un = store.units()[u];
      float* p = store.update_begin(static_cast<int64_t>(u));
      state_.step_range(*opt_, p, shard_grad, un.begin, un.end - un.begin, adamw_, lr, step_,
                        rounding_key(step_));
      store.update_end(static_cast<int64_t>(u), rounding_key(step_, /*weights=*/true));
    }
    return;
  }
  float* params = fsdp_ ? fsdp_->master() : store.device_param_data();
  state_.step(*opt_, params, shard_grad, adamw_, lr, step_, rounding_key(step_));
  if (fsdp_) fsdp_->reshard_all();  // gathered again, updated, at their next use
}

bool Trainer::masters_released() const {
  return fsdp_ ? fsdp_->masters_released() : model_->store().masters_released();
}

void Trainer::widen_masters() {
  if (fsdp_)
    fsdp_->widen_masters();
  else
    model_->store().widen_masters();
}

void Trainer::release_masters() {
  if (fsdp_)
    fsdp_->release_masters();
  else
    model_->store().release_masters();
}

uint64_t Trainer::rounding_key(int64_t step, bool weights) const {
  const uint64_t seed = cfg_.debug.seed >= 0 ? static_cast<uint64_t>(cfg_.debug.seed) : 0;
  // One stream per shard, the same on its replicas (DDP/HSDP: equal updates keep them equal):
  // the replicas are the outermost dimension, so a rank's shard is its rank within replica 0.
  const int64_t shard = dist::world().rank() % (dims_.world / dims_.dp_replicate);
  return random_u64(
      seed, (weights ? kWeightRoundingStream : kRoundingStream) + static_cast<uint64_t>(shard),
      static_cast<uint64_t>(step));
}

nlohmann::json Trainer::data_settings() const {
  const auto& t = cfg_.training;
  return {{"tokenizer", text_data_ ? nlohmann::json(resolved_tokenizer(cfg_)) : nullptr},
          {"local_batch_size", t.local_batch_size},
          {"global_batch_size", grad_accum_ * t.local_batch_size},
          {"seq_len", t.seq_len}};
}

void Trainer::resume_data(const ckpt::TrainState& st) {
  // The settings the checkpoint was trained with (absent in an older titan's): another
  // tokenizer or sequence length would change what the token ids and the loader's position
  // mean, so refuse; a batch size may change (torchtitan keeps the data position), so warn.
  const nlohmann::json now = data_settings();
  if (st.data.is_object()) {
    const nlohmann::json& was = st.data;
    auto str = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : ""; };
    if (was.contains("tokenizer") && was["tokenizer"].is_string() && now["tokenizer"].is_string())
      check(same_tokenizer(str(was["tokenizer"]), str(now["tokenizer"])),
            st.path + ": the checkpoint was trained with dataloader.tokenizer '" +
                str(was["tokenizer"]) + "', this run has '" + str(now["tokenizer"]) +
                "'; the token ids would not match: resume with --dataloader.tokenizer " +
                str(was["tokenizer"]) + " or use another dump_folder");
    if (was.contains("seq_len") && was["seq_len"].is_number_integer())
      check(was["seq_len"] == now["seq_len"],
            st.path + ": the checkpoint was trained with training.seq_len " +
                was["seq_len"].dump() + ", this run has " + now["seq_len"].dump() +
                "; resume with --training.seq_len " + was["seq_len"].dump() +
                " or use another dump_folder");
    for (const char* key : {"local_batch_size", "global_batch_size"})
      if (was.contains(key) && was[key].is_number_integer() && was[key] != now[key])
        log::warn(st.path + ": training." + key + " was " + was[key].dump() +
                  " when the checkpoint was saved, this run has " + now[key].dump() +
                  "; continuing from the same data position with the new batch size");
  }
  if (!loader_) return;  // DPO: the pairs of a step follow from the step
  if (st.dataloader.is_null()) {
    log::warn(st.path +
              " has no dataloader position; the data order restarts from the first document");
    return;
  }
  // The position in the one global stream (build_data), whatever the layout that saved it.
  const nlohmann::json& pos = st.dataloader;
  if (pos.is_object() && pos.contains("dp_ranks")) {  // an older per-rank split
    log::warn(st.path +
              " holds a data position per data-parallel rank (each reading its own documents), "
              "which this titan no longer uses; the data order restarts from the first document");
    return;
  }
  try {
    loader_->restore(pos);
  } catch (const Error& e) {
    throw Error(st.path + ": " + e.what());
  }
}

void Trainer::maybe_checkpoint() {
  const bool last = step_ == cfg_.training.steps;
  if (!checkpointer_->due(step_, last)) return;  // the same decision on every rank
  // bf16 masters: saved as fp32 (exact). Whole, the model's are read widened tensor by tensor
  // as they are written (ckpt::weight_tensor); sharded or sliced, they are widened in place for
  // the save and given back after it.
  const bool widened = (fsdp_ || sliced()) && masters_released();
  if (widened) widen_masters();
  struct Rerelease {
    Trainer* t;
    ~Rerelease() {
      if (t) t->release_masters();
    }
  } rerelease{widened ? this : nullptr};
  ckpt::TrainState st;
  st.step = step_;
  st.tokens_seen = tokens_seen_;
  st.optimizer_state_dtype = cfg_.optimizer.moments_dtype();
  // the same on every rank (one global stream); DPO's position is the step itself
  st.dataloader = loader_ ? loader_->state() : nlohmann::json{{"dpo_pairs", pairs_.size()}};
  st.data = data_settings();
  const bool model_only = last && cfg_.checkpoint.last_save_model_only;
  if (sliced() && model_only) {  // the whole model (every slice gathered), written by rank 0
    export_sliced(st, last);
    dist::world().barrier();
    return;
  }
  if (dims_.batch() == 1 && !dims_.sharded() && !sliced()) {  // one process
    HostMoments hm(*this, /*fetch=*/true);
    checkpointer_->maybe_save(st, last, *model_, hm.moments());
    return;
  }
  if ((dims_.sharded() || sliced()) && !model_only) {
    // Sharded: the ranks of replica 0 (world ranks 0 .. dp_shard·cp·tp − 1) write what they hold in
    // parallel into rank 0's temporary folder; rank 0 commits it once all have finished
    // (checkpointer.h).
    std::string tmp = rank0() ? checkpointer_->sharded_begin(step_) : "";
    broadcast_string(dist::world(), &tmp, 0);
    nlohmann::json mine;
    if (mesh_.replicate_rank == 0) {
      HostMoments hm(*this, /*fetch=*/true);
      mine = checkpointer_->write_shard(
          tmp, dist::world().rank(), dims_.world / dims_.dp_replicate,
          fsdp_ ? fsdp_->own_segments() : ckpt::Segments{{0, model_->num_params()}}, *model_,
          hm.master, hm.moments(), mesh_.tp_rank == 0);
    }
    nlohmann::json all = gather_json(dist::world(), mine);
    if (rank0()) {
      all.erase(std::remove(all.begin(), all.end(), nlohmann::json()), all.end());
      checkpointer_->sharded_commit(tmp, st, *model_, all);
    }
  } else if (fsdp_ && cfg_.checkpoint.last_save_in_hf) {
    // The Hugging Face export in parallel: unit u's tensors go to part u mod P (P = the ranks of
    // replica 0, at most one per unit), each written by its rank from the unit gathered whole.
    std::string tmp = rank0() ? checkpointer_->sharded_begin(step_) : "";
    broadcast_string(dist::world(), &tmp, 0);
    if (mesh_.replicate_rank == 0) {
      const int64_t units = static_cast<int64_t>(model_->store().units().size());
      const int64_t parts = std::min<int64_t>(dims_.fsdp(), units);
      ckpt::HfPart part;
      fsdp_->for_each_unit_whole([&](int64_t u) {
        if (u % parts == mesh_.fsdp_rank) part.add_unit(*model_, u, cfg_.checkpoint.export_dtype);
      });
      const nlohmann::json mine =
          mesh_.fsdp_rank < parts ? part.write(tmp, mesh_.fsdp_rank, parts) : nlohmann::json();
      nlohmann::json all = gather_json(*mesh_.fsdp, mine);
      if (rank0()) {
        all.erase(std::remove(all.begin(), all.end(), nlohmann::json()), all.end());
        checkpointer_->hf_parts_commit(tmp, step_, *model_, all);
      }
    }
  } else {  // DDP, or the model-only export: rank 0 writes the whole state
    if (fsdp_) fsdp_->gather_all();
    if (rank0()) {
      HostMoments hm(*this, /*fetch=*/true);
      checkpointer_->maybe_save(st, last, *model_, hm.moments());
    }
    if (fsdp_) fsdp_->reshard_all();
  }
  dist::world().barrier();  // the step folder is committed before any rank goes on
}

// The training loop as torchtitan's train() reads: data, forward/backward per microbatch, the
// gradient reductions, clipping, the optimizer step, metrics, validation, checkpoints and the
// stop conditions in order. Each phase is a call or a few lines; kept in one place so the order
// of the collectives every rank must match is visible at once.
void Trainer::train() {
  const auto& t = cfg_.training;
  log::set_color(!cfg_.metrics.disable_color_printing);
  if (step_ >= t.steps) {  // a finished run started again: nothing to do, nothing rewritten
    log::info("Already at step " + std::to_string(step_) +
              " = training.steps; nothing to train (raise --training.steps to train on)");
    return;
  }
  log::info("CPU: " + cpu::describe() + ", " + std::to_string(cpu::num_threads()) + " threads");
  const bool bf16 = t.mixed_precision_param == "bfloat16";
  const std::string& device = t.device;
  const ops::Device& dev = ops::device(device);
  const bool on_cpu = dev.host;
  if (!on_cpu)
    log::info("Device: " + device + " (" + (dev.describe ? dev.describe() : std::string()) + ")" +
              (dev.precision ? "; " + dev.precision(bf16) : std::string()));
  else if (bf16)
    log::info(std::string("Mixed precision: bf16 GEMM inputs, fp32 accumulation, ") +
              (t.dtype == "bfloat16" ? "bf16 master weights (projections; fp32 for the rest), "
                                       "fp32 gradients, "
                                     : "fp32 master weights and gradients, ") +
              (state_.dtype() == DType::BF16 ? "bf16"
               : state_.dtype() == DType::I8 ? "8-bit block-wise"
                                             : "fp32") +
              " AdamW moments; " +
              (ops::bf16_gemm_native()
                   ? "oneDNN bf16 matmul"
                   : "converting path (this CPU has no AVX512-BF16/AMX: bf16 values widened to "
                     "fp32, same numerics, fp32 speed)") +
              ", oneDNN picks " + ops::gemm_isa(true));
  else
    log::info("Precision: float32 throughout; oneDNN picks " + ops::gemm_isa(false));
  double peak = cfg_.metrics.peak_flops;
  if (peak <= 0 && dev.gemm_flops) peak = dev.gemm_flops(bf16);
  if (peak > 0 && cfg_.metrics.peak_flops <= 0) {
    log::info(std::string("Peak FLOPS measured with an 8192^3 ") + (bf16 ? "bf16" : "fp32") +
              " GEMM on the device");
  } else if (peak <= 0) {
    peak = bf16 ? ops::gemm_probe_flops_bf16() : ops::gemm_probe_flops();
    log::info(std::string("Peak FLOPS measured with a 2048^3 ") + (bf16 ? "bf16" : "fp32") +
              " oneDNN GEMM" + (on_cpu ? "" : " on the CPU (the device's cannot be measured)"));
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "Peak FLOPS used for computing MFU: %.3e", peak);
  log::info(buf);
  const double fpt = model_->flops_per_token(cfg_.training.seq_len),
               square = models::attention_flops_per_token(model_->dims(), cfg_.training.seq_len,
                                                          /*causal=*/false);
  std::snprintf(buf, sizeof buf,
                "FLOPs per token: %.4g (causal attention counted at half its square; "
                "torchtitan's count: %.4g)",
                fpt, fpt + square / 2);
  log::info(buf);
  int64_t total = models::frozen_weights(*model_);  // LoRA: the frozen base, then the adapters
  for (const auto& p : model_->params()) {
    int64_t whole = 1;  // a tensor-parallel slice: the whole tensor's
    for (int64_t x : p.shape) whole *= x;
    if (!p.alias) total += whole;
  }
  log::info("Model " + cfg_.model.name + " " + cfg_.model.flavor + " size: " + with_commas(total) +
            " total parameters");
  const int64_t per_rank = t.local_batch_size * t.seq_len;
  char beta_text[32];
  std::snprintf(beta_text, sizeof beta_text, "%g", cfg_.dpo.beta);
  log::info("Trainer is initialized with " +
            (cfg_.dpo.enable ? with_commas(t.local_batch_size) + " preference pairs per DP rank, " +
                                   with_commas(t.local_batch_size * grad_accum_ * dims_.batch()) +
                                   " pairs per train step (DPO " + cfg_.dpo.loss_type + ", beta " +
                                   beta_text + "), gradient accumulation steps "
                             : with_commas(per_rank) + " tokens per DP rank, " +
                                   with_commas(per_rank * grad_accum_ * dims_.batch()) +
                                   " tokens per train step, gradient accumulation steps ") +
            std::to_string(grad_accum_) + ", maximum context length " + std::to_string(t.seq_len) +
            ", total steps " + std::to_string(t.steps) + " (warmup " +
            std::to_string(sched_.warmup_steps) + ")");
  log::info("Training starts at step " + std::to_string(step_ + 1));

  MetricsWriter writer(
      cfg_.metrics.enable_jsonl && rank0() ? cfg_.dump_folder + "/metrics.jsonl" : "", log::color(),
      step_,
      cfg_.metrics.enable_tensorboard && rank0()
          ? cfg_.dump_folder + "/" + cfg_.metrics.save_tb_folder
          : "");
  const double flops_per_token = model_->flops_per_token(t.seq_len);
  double last_log = cpu::now_seconds(), data_since_log = 0;
  int64_t tokens_since_log = 0, steps_since_log = 0;
  while (step_ < t.steps) {
    StepResult r = step();
    tokens_since_log += r.tokens;
    data_since_log += data_time_;
    ++steps_since_log;
    if (step_ == 1 || step_ % cfg_.metrics.log_freq == 0) {
      const double now = cpu::now_seconds(), dt = now - last_log;
      StepMetrics m;
      m.step = step_;
      m.loss = r.loss;
      m.grad_norm = r.grad_norm;
      m.lr = r.lr;
      // The host's peak resident memory, or the device's memory in use (allocated once: its
      // peak after the first step) where titan can read it.
      double peak_rss = static_cast<double>(cpu::peak_rss_bytes());
      double total_mem = static_cast<double>(cpu::total_memory_bytes());
      if (int64_t dev_total = 0, dev_used = 0; dev.memory && dev.memory(&dev_total, &dev_used)) {
        peak_rss = static_cast<double>(dev_used);
        total_mem = static_cast<double>(dev_total);
      }
      mesh_.batch->all_reduce(&peak_rss, 1, dist::ReduceOp::max);  // the largest rank's
      m.memory_gib = peak_rss / (1024.0 * 1024.0 * 1024.0);
      m.memory_pct = 100.0 * peak_rss / total_mem;
      // torchtitan divides by the non-data-parallel degree: the tp ranks share their tokens' work
      m.tps = static_cast<double>(tokens_since_log) / dt / static_cast<double>(dims_.tp);
      m.tflops = flops_per_token * m.tps / 1e12;
      m.mfu = 100.0 * flops_per_token * m.tps / peak;
      m.step_time = dt / static_cast<double>(steps_since_log);
      m.data_loading_time = data_since_log / static_cast<double>(steps_since_log);
      m.n_tokens_seen = tokens_seen_;
      m.aux_loss = r.aux_loss;
      m.expert_load = r.expert_load;
      m.objective = r.objective;
      writer.log(m);
      last_log = now;
      tokens_since_log = 0;
      steps_since_log = 0;
      data_since_log = 0;
    }
    maybe_checkpoint();
    if (validator_ && validator_->should_validate(step_)) {
      const ValidationResult v = validate();
      ValidationMetrics vm;
      vm.step = step_;
      vm.loss = v.loss;
      vm.tokens = v.tokens;
      vm.tps = static_cast<double>(v.batches * per_rank) / v.seconds;
      vm.memory_gib = static_cast<double>(cpu::peak_rss_bytes()) / (1024.0 * 1024.0 * 1024.0);
      vm.memory_pct = 100.0 * static_cast<double>(cpu::peak_rss_bytes()) /
                      static_cast<double>(cpu::total_memory_bytes());
      writer.log_validation(vm);
      last_log += v.seconds;  // the training tps leaves validation time out
    }
  }
  if (step_ > first_step_) {
    RunTotals r;
    r.steps = static_cast<double>(step_ - first_step_);
    r.microbatches = grad_accum_;
    r.tp_bytes = tp_comm_bytes_, r.tp_seconds = tp_seconds_;
    r.cp_bytes = cp_comm_bytes_, r.cp_seconds = cp_seconds_;
    r.dp_bytes = step_comm_bytes_, r.ep_bytes = ep_comm_bytes_, r.ep_seconds = ep_seconds_;
    log_parallel_reports(cfg_, dims_, *model_, fsdp_.get(), r);
  }
  log::info("Training completed");
}

ValidationResult Trainer::validate() {
  check(validator_ != nullptr, "validator.enable is off");
  const ValidationResult v =
      validator_->validate(*model_, *mesh_.batch, mesh_.batch_rank, dims_.batch(),
                           cp_ ? cp_->slice() : models::CpSlice{});
  if (std::isfinite(v.loss)) return v;
  // Not a number to log and train on: stop, saying whether the weights are to blame.
  if (fsdp_) fsdp_->gather_all();   // on every rank: the loss is the same all-reduced value
  model_->store().widen_masters();  // bf16 masters: read as fp32
  const std::string bad = describe_nonfinite_weights(*model_);
  if (fsdp_) fsdp_->reshard_all();
  throw Error(
      "step " + std::to_string(step_) + ": the validation loss on validator.dataset_path '" +
      cfg_.validator.dataset_path + "' is not finite (" + std::to_string(v.loss) + "): " +
      (bad.empty() ? "the weights are finite but give non-finite activations on this data "
                     "(lower optimizer.lr, or look for extreme values in the data)"
                   : "the weights hold " + bad + " (lower optimizer.lr or check the data)"));
}

}  // namespace titan::train
