// The trainer's configuration tree, torchtitan's section and field names. Plain structs; each
// section lists its own fields in visit(), and fields() names them all by their dotted names,
// for flags, TOML files and printing.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace titan::config {

// A reference to one field of a section, and a visitor of a section's fields: the name within
// the section, where the value is stored, and the help line of `titan config show`.
using FieldRef = std::variant<int64_t*, double*, bool*, std::string*>;
using FieldVisitor = std::function<void(const char* name, FieldRef ref, const char* help)>;

struct ModelConfig {
  std::string name = "qwen3";
  std::string flavor = "debugmodel";
  // A Hugging Face model directory: the architecture comes from its config.json (the flavor is
  // then unused); the fields below still override it when set.
  std::string hf_assets_path;
  // Overrides of the flavor; 0 (or "") keeps the flavor's value.
  int64_t n_layers = 0, dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, hidden_dim = 0,
          vocab_size = 0;
  double rope_theta = 0;
  std::string attn_mask_type = "block_causal";
  // MoE overrides (0 keeps the flavor's / config.json's value).
  int64_t num_experts = 0, top_k = 0, moe_hidden_dim = 0;
  double load_balance_coeff = -1;    // torchtitan aux-loss-free bias; -1 keeps, 0 disables
  bool router_aux_loss = false;      // force Transformers' auxiliary loss on
  double router_aux_loss_coef = -1;  // -1 keeps (config.json's, else 0.001)
  void visit(const FieldVisitor& f);
};

struct TrainingConfig {
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;  // -1: local_batch_size × data-parallel degree
  int64_t seq_len = 2048;
  double max_norm = 1.0;
  int64_t steps = 10000;
  // torchtitan's precision fields. mixed_precision_param: the dtype the GEMMs compute in
  // (bfloat16 = bf16 inputs, fp32 accumulation, over fp32 master weights; float32 = all fp32).
  // mixed_precision_reduce: the gradient reduction dtype of data parallelism (float32).
  // dtype: the master weights' dtype (float32; bfloat16 = torchtitan's pure-bf16 training, not
  // implemented).
  std::string mixed_precision_param = "bfloat16";
  std::string mixed_precision_reduce = "float32";
  std::string dtype = "float32";
  // Where the model computes: cpu, or cuda (refused with the reason when titan was built without
  // CUDA or no GPU is visible; ops/device.h).
  std::string device = "cpu";
  void visit(const FieldVisitor& f);
};

struct OptimizerConfig {
  std::string name = "AdamW";
  double lr = 8e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  // torchtitan's: for-loop, foreach or fused compute alike here (one fused pass);
  // fused_opt_states_bf16 keeps the moments in bfloat16 (as state_dtype bfloat16).
  std::string implementation = "fused";
  // The dtype of the AdamW moments: float32, bfloat16 (stochastically rounded on each update) or
  // int8 (bitsandbytes' block-wise 8-bit quantization). Empty: float32, or bfloat16 under
  // implementation fused_opt_states_bf16.
  std::string state_dtype;
  // The resolved state dtype ("float32", "bfloat16" or "int8").
  std::string moments_dtype() const {
    return !state_dtype.empty()                        ? state_dtype
           : implementation == "fused_opt_states_bf16" ? "bfloat16"
                                                       : "float32";
  }
  // torchtitan's: each FSDP unit's update applied in the backward as soon as its gradient is
  // complete, its gradient then freed, so no whole-model gradient buffer exists.
  bool early_step_in_backward = false;
  void visit(const FieldVisitor& f);
};

struct LRSchedulerConfig {
  int64_t warmup_steps = 200;
  double decay_ratio = -1;  // < 0: None (decay starts right after warmup)
  std::string decay_type = "linear";
  double min_lr_factor = 0.0;
  void visit(const FieldVisitor& f);
};

struct MetricsConfig {
  int64_t log_freq = 10;
  bool disable_color_printing = false;
  bool enable_jsonl = true;         // {dump_folder}/metrics.jsonl
  bool enable_tensorboard = false;  // event files in {dump_folder}/{save_tb_folder}
  std::string save_tb_folder = "tb";
  double peak_flops = 0;  // FLOP/s for MFU; 0 = measure with a GEMM probe at start
  void visit(const FieldVisitor& f);
};

struct DataLoaderConfig {
  // auto: the fortunes corpus (read as fortunes) without dataset_path, else by file extension
  std::string dataset = "auto";  // auto | fortunes | text | jsonl | chat | tokens
  std::string dataset_path;      // file, directory, glob or comma list; empty: the default
  // One positive weight per item of dataset_path (comma-separated or a TOML list): the items are
  // mixed by weight (data/dataset.h MixedDocuments); empty: read as one source
  std::string dataset_weights;
  // auto: model.hf_assets_path's tokenizer.json when it has one, else byte; "byte" (256 bytes +
  // BOS/EOS/pad); or a tokenizer.json (or its directory)
  std::string tokenizer = "auto";
  bool shuffle = true;  // reshuffle documents each epoch after the first
  int64_t seed = 42;
  std::string text_field = "text";  // JSON lines: the field holding a document
  bool skip_malformed = false;      // JSON lines: skip and count bad lines instead of failing
  void visit(const FieldVisitor& f);
};

// Supervised fine-tuning on chat records (dataloader.dataset chat; data/chat_dataset.h).
struct SftConfig {
  bool train_on_prompt = false;  // the loss on every token, not only the assistant turns
  bool packing = true;           // conversations packed into rows; false: one per row, padded
  // With packing: bfd (best-fit decreasing: whole conversations fill rows, the rest padded; TRL's
  // default) or wrapped (one stream cut into rows: no padding, a conversation may continue in
  // the next row)
  std::string packing_strategy = "bfd";
  // a conversation longer than training.seq_len + 1 tokens: truncate (keep its start) or drop
  std::string truncation = "truncate";
  void visit(const FieldVisitor& f);
};

// Preference tuning (TRL's DPOTrainer / DPOConfig names and defaults): with enable, the dataset's
// records are preference pairs ({"prompt", "chosen", "rejected"}, conversational or plain) and
// each step minimises the DPO loss of training.local_batch_size pairs per data-parallel rank
// (microbatches: pairs) instead of the next-token loss. The reference model is the starting
// weights: with LoRA the base with its adapters off; otherwise the reference log-probabilities of
// every pair are computed once with the starting weights, before the first step, and kept in
// DUMP_FOLDER/dpo_reference/ for a resume.
struct DpoConfig {
  bool enable = false;
  double beta = 0.1;
  std::string loss_type = "sigmoid";  // sigmoid, ipo, hinge or robust
  double label_smoothing = 0.0;       // robust: the assumed share of flipped labels, [0, 0.5)
  void visit(const FieldVisitor& f);
};

// torchtitan's validator: every freq steps (and step 1), the loss over a separate dataset
// (read once from the start, no shuffle; steps -1: all of it).
struct ValidatorConfig {
  bool enable = false;
  int64_t freq = 10;
  int64_t steps = -1;
  std::string dataset = "auto";  // as dataloader.dataset; auto: by file extension
  std::string dataset_path;
  void visit(const FieldVisitor& f);
};

// torchtitan's activation_checkpoint: none keeps every activation; full keeps each block's input
// and recomputes the block in the backward; selective with an integer N does that for every N-th
// block ((i+1) % N == 0), with op it keeps the GEMM and attention outputs of every block and
// recomputes the norms, RoPE and SwiGLU. Results are bitwise the same in every mode.
struct ActivationCheckpointConfig {
  std::string mode = "none";
  std::string selective_ac_option = "2";
  void visit(const FieldVisitor& f);
};

// torchtitan's parallelism.* (the product of the degrees, with data_parallel_shard_degree -1
// standing for the rest, must equal the number of ranks; dist/parallel_dims.h).
struct ParallelismConfig {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;
  int64_t tensor_parallel_degree = 1;
  int64_t expert_parallel_degree = 1;
  int64_t context_parallel_degree = 1;
  int64_t pipeline_parallel_degree = 1;
  // Context parallelism's split of each sequence (headtail: 2·cp chunks, rank r holding chunks r
  // and 2·cp−1−r) and its exchange of keys and values (allgather).
  std::string context_parallel_load_balancer = "headtail";
  std::string context_parallel_rotate_method = "allgather";
  std::string fsdp_reshard_after_forward = "default";  // default | always | never
  // Under tensor parallelism: norms and residuals on sequence shards; the loss on vocab shards.
  bool enable_sequence_parallel = true;
  bool disable_loss_parallel = false;
  void visit(const FieldVisitor& f);
};

struct LossConfig {
  int64_t num_chunks = 8;  // lm_head + cross-entropy chunks per microbatch
  void visit(const FieldVisitor& f);
};

// torchtitan's checkpoint.* fields and semantics (torchtitan.md §1.4, §6).
struct CheckpointConfig {
  bool enable = false;
  std::string folder = "checkpoint";  // relative to dump_folder
  int64_t interval = 500;
  std::string initial_load_path;  // absolute
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool last_save_model_only = true;
  bool last_save_in_hf = false;
  std::string export_dtype = "float32";  // float32 | bfloat16 | float16
  int64_t keep_latest_k = 10;            // 0 keeps all
  int64_t load_step = -1;                // -1: latest
  void visit(const FieldVisitor& f);
};

// titan eval: mean loss / perplexity over dataset batches, or logits for given token ids.
struct EvalConfig {
  int64_t steps = 10;  // batches of the dataset to average over
  std::string
      tokens_path;         // safetensors with input_ids [B,S] (and optional labels): evaluate these
  std::string logits_out;  // write the logits for tokens_path here (safetensors)
  void visit(const FieldVisitor& f);
};

// LoRA (PEFT's LoraConfig): low-rank adapters on the chosen projections of every layer, the base
// model frozen (no gradients, no optimizer state); rank 0 trains the whole model.
struct LoraConfig {
  int64_t rank = 0;  // r; 0: no adapters
  double alpha = 16;
  double dropout = 0;
  // torchtitan leaves (wq,wk,wv,wo,w1,w2,w3) or Hugging Face names (q_proj, ..., down_proj)
  std::string target_modules = "wq,wk,wv,wo,w1,w2,w3";
  bool use_rslora = false;       // scale alpha / sqrt(r) instead of alpha / r
  bool merge_on_export = false;  // the last HF save: merged full weights, not a PEFT adapter
  // A PEFT adapter directory to start from or generate with: its adapter_config.json sets rank,
  // alpha, target_modules and use_rslora.
  std::string adapter_path;
  void visit(const FieldVisitor& f);
};

struct DebugConfig {
  int64_t seed = -1;  // -1: None (seed 0 is then used for the init)
  bool print_config = false;
  std::string save_config_file;  // write the resolved config here as TOML
  void visit(const FieldVisitor& f);
};

// The job file itself: --job.config_file applies a TOML file between the config function and
// the flags (precedence: flags > TOML > config function).
struct JobFileConfig {
  std::string config_file;
  void visit(const FieldVisitor& f);
};

// --override.imports: plugin libraries whose overrides rewrite the module tree (comma-separated).
struct OverrideConfig {
  std::string imports;
  void visit(const FieldVisitor& f);
};

struct JobConfig {
  std::string dump_folder = "./outputs";
  JobFileConfig job;
  OverrideConfig override_;
  ModelConfig model;
  TrainingConfig training;
  OptimizerConfig optimizer;
  LRSchedulerConfig lr_scheduler;
  MetricsConfig metrics;
  DataLoaderConfig dataloader;
  SftConfig sft;
  DpoConfig dpo;
  LossConfig loss;
  ActivationCheckpointConfig activation_checkpoint;
  ParallelismConfig parallelism;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  ValidatorConfig validator;
  LoraConfig lora;
  DebugConfig debug;
};

// One field of a JobConfig, by dotted name ("training.steps"; dump_folder has no section).
struct Field {
  std::string name;
  FieldRef ref;
  std::string help;
};
std::vector<Field> fields(JobConfig& c);

// Applies "--a.b value", "--a.b=value" and boolean "--a.b" flags in order. Throws titan::Error
// naming the flag (and the nearest valid name for an unknown one) or the bad value.
void apply_flags(JobConfig& c, const std::vector<std::string>& args);

// Sets one field from its text form (as a flag would); `source` names where it came from.
void set_field(JobConfig& c, const std::string& name, const std::string& value,
               const std::string& source);

// The config as TOML: top-level fields, then one [section] per section, "key = value".
std::string to_string(JobConfig& c);

// Applies a TOML job file (sections and keys as the flags name them). Throws titan::Error naming
// the file, line and key for a parse error, an unknown key or a value of the wrong type.
void apply_toml_file(JobConfig& c, const std::string& path);

// The whole command-line pipeline: config function NAME, then --job.config_file, then the other
// flags, then validation: validate() and then check_model (the model's own checks,
// models::validate_model_config; config/ knows no model), before debug.save_config_file.
JobConfig build_job_config(const std::string& name, const std::vector<std::string>& flags,
                           const std::function<void(const JobConfig&)>& check_model = {});

// Checks cross-field rules (batch sizes, schedule, checkpoint and data fields, ...). The model
// section is checked by the model (models::validate_model_config).
void validate(const JobConfig& c);

// dataloader.dataset_weights as numbers (empty when not set). Throws titan::Error naming an item
// that is not a finite positive number.
std::vector<double> dataset_weights(const JobConfig& c);

// Config functions registered by name.
using ConfigFn = std::function<JobConfig()>;
void register_config(const std::string& name, ConfigFn fn);
std::vector<std::string> config_names();
// The named config; throws titan::Error listing the available names for an unknown one.
JobConfig make_config(const std::string& name);

// Edit distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace titan::config
