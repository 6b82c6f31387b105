#include "titan/config/job_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "toml++/toml.h"

namespace titan::config {

void ModelConfig::visit(const FieldVisitor& f) {
  f("name", &name, "model family (qwen3)");
  f("flavor", &flavor,
    "debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, debugmodel_moe, 30B-A3B, 235B-A22B");
  f("hf_assets_path", &hf_assets_path,
    "Hugging Face model directory: architecture from its config.json");
  f("n_layers", &n_layers, "override the flavor's layer count (0: keep)");
  f("dim", &dim, "override the hidden size (0: keep)");
  f("n_heads", &n_heads, "override the query heads (0: keep)");
  f("n_kv_heads", &n_kv_heads, "override the key/value heads (0: keep)");
  f("head_dim", &head_dim, "override the head dimension (0: keep)");
  f("hidden_dim", &hidden_dim, "override the SwiGLU hidden size (0: keep)");
  f("vocab_size", &vocab_size, "override the vocabulary size (0: keep)");
  f("rope_theta", &rope_theta, "override the RoPE base (0: keep)");
  f("attn_mask_type", &attn_mask_type, "block_causal or causal");
  f("num_experts", &num_experts, "MoE: override the expert count (0: keep)");
  f("top_k", &top_k, "MoE: override experts per token (0: keep)");
  f("moe_hidden_dim", &moe_hidden_dim, "MoE: override the expert hidden size (0: keep)");
  f("load_balance_coeff", &load_balance_coeff,
    "MoE: torchtitan's aux-loss-free expert-bias step (-1: keep; 0: off)");
  f("router_aux_loss", &router_aux_loss, "MoE: add Transformers' auxiliary load-balancing loss");
  f("router_aux_loss_coef", &router_aux_loss_coef,
    "MoE: coefficient of the auxiliary loss (-1: keep)");
}

void TrainingConfig::visit(const FieldVisitor& f) {
  f("local_batch_size", &local_batch_size, "sequences per microbatch");
  f("global_batch_size", &global_batch_size,
    "sequences per step (-1: local × data-parallel degree); a multiple gives accumulation");
  f("seq_len", &seq_len, "tokens per sequence");
  f("max_norm", &max_norm, "gradient clipping L2 norm");
  f("steps", &steps, "optimizer steps");
  f("mixed_precision_param", &mixed_precision_param,
    "GEMM compute dtype: bfloat16 (bf16 inputs, fp32 accumulation, fp32 master weights) or "
    "float32");
  f("mixed_precision_reduce", &mixed_precision_reduce,
    "gradient reduction dtype across data-parallel ranks: float32");
  f("dtype", &dtype, "master weight dtype: float32");
  f("device", &device, "where the model computes: cpu, cuda (one GPU per process)");
}

void OptimizerConfig::visit(const FieldVisitor& f) {
  f("name", &name, "AdamW");
  f("lr", &lr, "learning rate");
  f("beta1", &beta1, "AdamW beta1");
  f("beta2", &beta2, "AdamW beta2");
  f("eps", &eps, "AdamW epsilon");
  f("weight_decay", &weight_decay, "decoupled weight decay");
  f("implementation", &implementation,
    "for-loop, foreach, fused, or fused_opt_states_bf16 (the moments in bfloat16)");
  f("state_dtype", &state_dtype,
    "the AdamW moments' dtype: float32, bfloat16 (stochastic rounding) or int8 (bitsandbytes' "
    "8-bit block-wise AdamW); empty: float32, bfloat16 with fused_opt_states_bf16");
  f("early_step_in_backward", &early_step_in_backward,
    "apply each unit's update in the backward as soon as its gradient is complete, then free "
    "the gradient (no gradient accumulation; training.max_norm is not applied)");
}

void LRSchedulerConfig::visit(const FieldVisitor& f) {
  f("warmup_steps", &warmup_steps, "linear warmup steps");
  f("decay_ratio", &decay_ratio, "fraction of steps spent decaying (<0: all steps after warmup)");
  f("decay_type", &decay_type, "linear, sqrt or cosine");
  f("min_lr_factor", &min_lr_factor, "floor of the decay");
}

void MetricsConfig::visit(const FieldVisitor& f) {
  f("log_freq", &log_freq, "log every N steps (and step 1)");
  f("disable_color_printing", &disable_color_printing, "plain console");
  f("enable_jsonl", &enable_jsonl, "write {dump_folder}/metrics.jsonl");
  f("enable_tensorboard", &enable_tensorboard,
    "write TensorBoard event files to {dump_folder}/{save_tb_folder}");
  f("save_tb_folder", &save_tb_folder, "TensorBoard folder under dump_folder");
  f("peak_flops", &peak_flops, "peak FLOP/s for MFU (0: measure with a GEMM probe)");
}

void DataLoaderConfig::visit(const FieldVisitor& f) {
  f("dataset", &dataset,
    "source: auto (fortunes corpus without dataset_path, else by extension; chat records "
    "found in JSON lines), fortunes, text (a line each), jsonl, chat (conversations: "
    "messages, or prompt + completion), tokens (titan tokenize shards), c4, c4_validation, "
    "c4_test (C4's files on disk)");
  f("dataset_path", &dataset_path, "file, directory, glob or comma-separated list");
  f("dataset_weights", &dataset_weights,
    "mix the items of dataset_path by these weights (comma-separated, one each)");
  f("tokenizer", &tokenizer,
    "auto (model.hf_assets_path's tokenizer.json if it has one, else byte), byte, or a "
    "tokenizer.json or the directory holding it");
  f("shuffle", &shuffle, "reshuffle documents each later epoch");
  f("seed", &seed, "shuffle seed");
  f("text_field", &text_field, "JSON lines: the document's field");
  f("skip_malformed", &skip_malformed,
    "JSON lines: skip and count malformed lines instead of stopping");
}

void SftConfig::visit(const FieldVisitor& f) {
  f("train_on_prompt", &train_on_prompt,
    "chat data: the loss on every token, not only the assistant turns");
  f("packing", &packing, "chat data: pack conversations into rows (false: one per row, padded)");
  f("packing_strategy", &packing_strategy,
    "chat data with packing: bfd (whole conversations, best fit, padded) or wrapped (cut into "
    "rows)");
  f("truncation", &truncation,
    "chat data: a conversation longer than training.seq_len + 1 tokens: truncate or drop");
}

void DpoConfig::visit(const FieldVisitor& f) {
  f("enable", &enable,
    "train on preference pairs (prompt, chosen, rejected) with the DPO loss instead of the "
    "next-token loss");
  f("beta", &beta, "DPO: the temperature of the implicit reward (TRL's beta)");
  f("loss_type", &loss_type, "DPO: sigmoid, ipo, hinge or robust (TRL's loss_type)");
  f("label_smoothing", &label_smoothing,
    "DPO robust loss: the assumed share of preference labels that are flipped, in [0, 0.5)");
}

void LossConfig::visit(const FieldVisitor& f) {
  f("num_chunks", &num_chunks, "lm_head + cross-entropy chunks");
}

void ParallelismConfig::visit(const FieldVisitor& f) {
  f("data_parallel_replicate_degree", &data_parallel_replicate_degree, "DDP/HSDP replicas");
  f("data_parallel_shard_degree", &data_parallel_shard_degree,
    "FSDP shards (-1: the ranks left over)");
  f("tensor_parallel_degree", &tensor_parallel_degree,
    "tensor parallel degree (each block's projections split over the TP ranks)");
  f("expert_parallel_degree", &expert_parallel_degree,
    "expert parallel degree (MoE experts split over ranks of the shard group)");
  f("enable_sequence_parallel", &enable_sequence_parallel,
    "tensor parallelism: norms and residuals on sequence shards");
  f("disable_loss_parallel", &disable_loss_parallel,
    "tensor parallelism: gather the logits instead of a vocab-parallel loss");
  f("context_parallel_degree", &context_parallel_degree,
    "context parallel degree (each sequence split over the CP ranks; attention across them)");
  f("context_parallel_load_balancer", &context_parallel_load_balancer,
    "context parallelism: how sequences split (headtail)");
  f("context_parallel_rotate_method", &context_parallel_rotate_method,
    "context parallelism: how keys and values travel (allgather)");
  f("pipeline_parallel_degree", &pipeline_parallel_degree,
    "pipeline parallel degree (not implemented: 1)");
  f("fsdp_reshard_after_forward", &fsdp_reshard_after_forward, "default, always or never");
}

void ActivationCheckpointConfig::visit(const FieldVisitor& f) {
  f("mode", &mode, "none | selective | full (recompute blocks in the backward)");
  f("selective_ac_option", &selective_ac_option,
    "selective: N (every N-th block fully) or op (keep GEMM/attention outputs)");
}

void CheckpointConfig::visit(const FieldVisitor& f) {
  f("enable", &enable, "save checkpoints");
  f("folder", &folder, "checkpoint folder under dump_folder");
  f("interval", &interval, "save every N steps");
  f("initial_load_path", &initial_load_path,
    "a checkpoint to start from (relative: to the working directory)");
  f("initial_load_model_only", &initial_load_model_only,
    "load only the model from initial_load_path");
  f("initial_load_in_hf", &initial_load_in_hf,
    "the initial checkpoint is Hugging Face safetensors");
  f("last_save_model_only", &last_save_model_only, "the last save holds only the model");
  f("last_save_in_hf", &last_save_in_hf, "the last save is a Hugging Face model directory");
  f("export_dtype", &export_dtype, "dtype of a model-only last save: float32, bfloat16, float16");
  f("keep_latest_k", &keep_latest_k, "keep this many (0: all)");
  f("load_step", &load_step, "step to resume (-1: latest)");
}

void EvalConfig::visit(const FieldVisitor& f) {
  f("steps", &steps, "dataset batches for titan eval");
  f("tokens_path", &tokens_path, "safetensors with input_ids to evaluate");
  f("logits_out", &logits_out, "write logits for eval.tokens_path here");
}

void ValidatorConfig::visit(const FieldVisitor& f) {
  f("enable", &enable, "evaluate on a validation set during training");
  f("freq", &freq, "validate every N steps (and at step 1)");
  f("steps", &steps, "batches per validation (-1: the whole set)");
  f("dataset", &dataset, "as dataloader.dataset (auto: by extension)");
  f("dataset_path", &dataset_path, "the validation corpus");
}

void LoraConfig::visit(const FieldVisitor& f) {
  f("rank", &rank, "LoRA rank r (0: train the whole model)");
  f("alpha", &alpha, "LoRA alpha (scale alpha / r)");
  f("dropout", &dropout, "dropout on the adapters' input while training");
  f("target_modules", &target_modules,
    "projections to adapt: wq,wk,wv,wo,w1,w2,w3 or q_proj,...,down_proj");
  f("use_rslora", &use_rslora, "rank-stabilized scale alpha / sqrt(r)");
  f("merge_on_export", &merge_on_export,
    "the last Hugging Face save holds the merged weights instead of the adapter");
  f("adapter_path", &adapter_path, "a PEFT adapter directory to start from");
}

void DebugConfig::visit(const FieldVisitor& f) {
  f("seed", &seed, "seed for init and data (-1: none)");
  f("print_config", &print_config, "print the resolved config at start");
  f("save_config_file", &save_config_file, "write the resolved config to this TOML file");
}

void JobFileConfig::visit(const FieldVisitor& f) {
  f("config_file", &config_file, "TOML job file applied before the flags");
}

void OverrideConfig::visit(const FieldVisitor& f) {
  f("imports", &imports, "plugin libraries whose overrides apply (comma-separated)");
}

std::vector<Field> fields(JobConfig& c) {
  std::vector<Field> out{{"dump_folder", &c.dump_folder, "folder for metrics and checkpoints"}};
  auto section = [&](const std::string& name, auto& s) {
    s.visit([&](const char* field, FieldRef ref, const char* help) {
      out.push_back({name + "." + field, ref, help});
    });
  };
  section("model", c.model);
  section("training", c.training);
  section("optimizer", c.optimizer);
  section("lr_scheduler", c.lr_scheduler);
  section("metrics", c.metrics);
  section("dataloader", c.dataloader);
  section("sft", c.sft);
  section("dpo", c.dpo);
  section("loss", c.loss);
  section("parallelism", c.parallelism);
  section("activation_checkpoint", c.activation_checkpoint);
  section("checkpoint", c.checkpoint);
  section("eval", c.eval);
  section("validator", c.validator);
  section("lora", c.lora);
  section("debug", c.debug);
  section("job", c.job);
  section("override", c.override_);
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

std::string nearest(const std::string& name, const std::vector<std::string>& names) {
  std::string best;
  size_t bd = SIZE_MAX;
  for (const auto& n : names) {
    size_t d = edit_distance(name, n);
    if (d < bd) {
      bd = d;
      best = n;
    }
  }
  return best;
}

// `flag` is how the field is named in messages ("--training.steps" or "job.toml: training.steps").
void parse_value(const std::string& flag, const std::string& value, FieldRef ref) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = value;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (value == "true" || value == "True" || value == "1")
            *p = true;
          else if (value == "false" || value == "False" || value == "0")
            *p = false;
          else
            throw Error(flag + " expects true or false, got '" + value + "'");
        } else if constexpr (std::is_same_v<T, int64_t>) {
          errno = 0;
          char* end = nullptr;
          long long v = std::strtoll(value.c_str(), &end, 10);
          if (value.empty() || *end != '\0')
            throw Error(flag + " expects an integer, got '" + value + "'");
          if (errno == ERANGE)
            throw Error(flag + " expects an integer, got '" + value +
                        "', which is out of range (integers go from -9223372036854775808 to "
                        "9223372036854775807)");
          *p = v;
        } else {
          errno = 0;
          char* end = nullptr;
          double v = std::strtod(value.c_str(), &end);
          if (value.empty() || *end != '\0')
            throw Error(flag + " expects a number, got '" + value + "'");
          if (errno == ERANGE && std::fabs(v) > 1)  // overflow (underflow rounds to 0: fine)
            throw Error(flag + " expects a number, got '" + value + "', which is out of range");
          if (!std::isfinite(v)) throw Error(flag + " expects a number, got '" + value + "'");
          *p = v;
        }
      },
      ref);
}

}  // namespace

void apply_flags(JobConfig& c, const std::vector<std::string>& args) {
  std::vector<Field> fs = fields(c);
  std::vector<std::string> names;
  for (const auto& f : fs) names.push_back(f.name);
  std::map<std::string, std::string> given;  // flag -> its text, for a flag given twice
  const auto is_bool_word = [](const std::string& v) {
    return v == "true" || v == "false" || v == "True" || v == "False" || v == "1" || v == "0";
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      throw Error("unexpected argument '" + a + "'; options look like --section.field value");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = std::find_if(fs.begin(), fs.end(), [&](const Field& f) { return f.name == name; });
    if (it == fs.end())
      throw Error("unknown option --" + name + "; did you mean --" + nearest(name, names) +
                  "? ('titan config show' lists every field)");
    if (!has_value) {
      if (std::holds_alternative<bool*>(it->ref)) {
        // --flag alone is true; a word after it is its value, which must be a boolean.
        const bool has_word = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
        check(!has_word || is_bool_word(args[i + 1]),
              "--" + name + " expects true or false (or True, False, 1, 0), got '" +
                  (has_word ? args[i + 1] : "") + "'");
        value = has_word ? args[++i] : "true";
      } else {
        if (i + 1 >= args.size()) throw Error("--" + name + " needs a value");
        value = args[++i];
      }
    }
    // Given twice with different values: the last one is used (as argparse and torchtitan do,
    // so that a script can append an override), and said once.
    if (auto [at, first] = given.emplace(name, value); !first && at->second != value) {
      log::warn("--" + name + " is given twice, as '" + at->second + "' and then '" + value +
                "': the last one is used");
      at->second = value;
    }
    parse_value("--" + name, value, it->ref);
    // "0: keep" fields: 0 is what leaving the flag out means, so an explicit 0 is a mistake.
    const bool zero = std::visit(
        [](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) return *p == 0;
          return false;
        },
        it->ref);
    check(!zero || !it->help.ends_with("(0: keep)"),
          "--" + name + " " + value +
              " is not a valid value (0 is the default, which keeps the flavor's value); give "
              "a positive value or leave the flag out");
  }
}

void set_field(JobConfig& c, const std::string& name, const std::string& value,
               const std::string& source) {
  std::vector<Field> fs = fields(c);
  std::vector<std::string> names;
  for (const auto& f : fs) names.push_back(f.name);
  auto it = std::find_if(fs.begin(), fs.end(), [&](const Field& f) { return f.name == name; });
  if (it == fs.end())
    throw Error(source + ": unknown key '" + name + "'; did you mean '" + nearest(name, names) +
                "'?");
  parse_value(source + ": " + name, value, it->ref);
}

namespace {
// The shortest decimal form that reads back to the same double.
std::string shortest(double v) {
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
}  // namespace

std::string to_string(JobConfig& c) {
  std::ostringstream os;
  std::string section;
  for (const auto& f : fields(c)) {
    auto dot = f.name.find('.');
    std::string sec = dot == std::string::npos ? "" : f.name.substr(0, dot);
    std::string key = dot == std::string::npos ? f.name : f.name.substr(dot + 1);
    if (sec != section) {
      os << "\n[" << sec << "]\n";
      section = sec;
    }
    os << key << " = ";
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) {
            os << '"';
            for (char ch : *p) {
              if (ch == '"' || ch == '\\') os << '\\';
              os << ch;
            }
            os << '"';
          } else if constexpr (std::is_same_v<T, double>) {
            std::string v = shortest(*p);  // TOML floats need a '.', 'e', "inf" or "nan"
            if (v.find_first_of(".eEn") == std::string::npos) v += ".0";
            os << v;
          } else if constexpr (std::is_same_v<T, bool>)
            os << (*p ? "true" : "false");
          else
            os << *p;
        },
        f.ref);
    os << "\n";
  }
  return os.str();
}

namespace {
// What a field of this kind expects, for messages.
std::string expected_type(const FieldRef& ref) {
  if (std::holds_alternative<int64_t*>(ref)) return "an integer";
  if (std::holds_alternative<double*>(ref)) return "a number";
  if (std::holds_alternative<bool*>(ref)) return "true or false";
  return "a string";
}

// Job files are small text files: a directory, a FIFO or /dev/zero is refused before reading.
constexpr std::uintmax_t kMaxJobFileBytes = 16u << 20;

void check_job_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  check(std::filesystem::exists(path, ec), what + " '" + path + "' does not exist");
  check(std::filesystem::is_regular_file(path, ec),
        what + " '" + path + "' is not a regular file (a TOML job file is expected)");
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec, what + " '" + path + "': cannot read its size (" + ec.message() + ")");
  check(size <= kMaxJobFileBytes, what + " '" + path + "' is " + std::to_string(size) +
                                      " bytes; a TOML job file is at most 16 MiB");
}
}  // namespace

void apply_toml_file(JobConfig& c, const std::string& path) {
  check_job_file(path, "job file");
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw Error(path + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": " +
                std::string(e.description()));
  }
  std::vector<Field> fs = fields(c);
  auto apply = [&](const toml::node& v, const std::string& key) {
    const std::string at = path + ":" + std::to_string(v.source().begin.line);
    auto it = std::find_if(fs.begin(), fs.end(), [&](const Field& f) { return f.name == key; });
    if (it == fs.end()) {
      set_field(c, key, "", at);  // throws: unknown key, with the nearest name
      return;
    }
    std::string text;
    if (auto s = v.as_string()) {
      text = s->get();
    } else if (auto i = v.as_integer()) {
      text = std::to_string(i->get());
    } else if (auto d = v.as_floating_point()) {
      text = shortest(d->get());
    } else if (auto b = v.as_boolean()) {
      text = b->get() ? "true" : "false";
    } else if (auto a = v.as_array()) {
      // String fields that take lists (dataset paths, override.imports) take a list of strings,
      // joined with commas as on the command line; no other field takes a list.
      check(std::holds_alternative<std::string*>(it->ref),
            at + ": " + key + " expects " + expected_type(it->ref) + ", got a list");
      for (const auto& x : *a) {
        const auto* s = x.as_string();
        const auto* i = x.as_integer();
        const auto* d = x.as_floating_point();
        check(s || i || d, at + ": " + key + " must be a string or a list of strings or numbers");
        text += (text.empty() ? "" : ",") + (s   ? s->get()
                                             : i ? std::to_string(i->get())
                                                 : shortest(d->get()));
      }
    } else {
      throw Error(at + ": " + key + " expects " + expected_type(it->ref) +
                  ", got a value of another TOML type");
    }
    // Job files do not nest: a config_file inside one would be silently ignored.
    check(key != "job.config_file" || text.empty(),
          at +
              ": job.config_file inside a job file is not applied (job files do not nest); "
              "merge '" +
              text + "' into this file or pass --job.config_file on the command line");
    set_field(c, key, text, at);
  };
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (const auto* t = v.as_table()) {
      for (const auto& [k2, v2] : *t) {
        const std::string name = key + "." + std::string(k2.str());
        check(!v2.is_table(), path + ": nested table '" + name + "' is not a config field");
        apply(v2, name);
      }
    } else {
      apply(v, key);
    }
  }
}

namespace {

// Options that would do nothing in this run are refused, one line each, as eval.logits_out
// without eval.tokens_path is: a value changed from the config function's (by the job file or a
// flag) that no part of the run would read. (torchtitan ignores most of these silently; a
// mistyped intent is then found only when the result is wrong.)
void check_no_dead_options(const JobConfig& c, const JobConfig& base) {
  const LoraConfig &lo = c.lora, &lb = base.lora;
  if (lo.rank == 0 && lo.adapter_path.empty()) {  // no adapters
    const char* f = lo.alpha != lb.alpha                       ? "alpha"
                    : lo.dropout != lb.dropout                 ? "dropout"
                    : lo.target_modules != lb.target_modules   ? "target_modules"
                    : lo.use_rslora != lb.use_rslora           ? "use_rslora"
                    : lo.merge_on_export != lb.merge_on_export ? "merge_on_export"
                                                               : nullptr;
    check(f == nullptr, std::string("lora.") + (f ? f : "") +
                            " has no effect without adapters: set lora.rank (or "
                            "lora.adapter_path), or leave lora." +
                            (f ? f : "") + " out");
  }
  check(c.checkpoint.enable || c.checkpoint.load_step == base.checkpoint.load_step,
        "checkpoint.load_step " + std::to_string(c.checkpoint.load_step) +
            " has no effect with checkpoint.enable false (nothing is resumed); add "
            "--checkpoint.enable true or leave checkpoint.load_step out");
  const auto &ac = c.activation_checkpoint, &ab = base.activation_checkpoint;
  check(ac.mode == "selective" || ac.selective_ac_option == ab.selective_ac_option,
        "activation_checkpoint.selective_ac_option '" + ac.selective_ac_option +
            "' has no effect with activation_checkpoint.mode " + ac.mode +
            "; set the mode to selective or leave the option out");
}

}  // namespace

JobConfig build_job_config(const std::string& name, const std::vector<std::string>& flags,
                           const std::function<void(const JobConfig&)>& check_model) {
  JobConfig c = make_config(name);
  const JobConfig base = c;  // the config function's values, before the job file and flags
  // The TOML file comes first whatever its position among the flags: flags > TOML > function.
  std::vector<std::string> rest;
  std::string file;
  int files = 0;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == "--job.config_file") {
      check(i + 1 < flags.size(), "--job.config_file needs a path");
      file = flags[++i];
      ++files;
    } else if (flags[i].rfind("--job.config_file=", 0) == 0) {
      file = flags[i].substr(18);
      ++files;
    } else {
      rest.push_back(flags[i]);
    }
  }
  check(files <= 1, "--job.config_file given more than once; pass one job file");
  if (!file.empty()) {
    check_job_file(file, "--job.config_file");
    apply_toml_file(c, file);
    c.job.config_file = file;
  }
  apply_flags(c, rest);
  // A relative checkpoint.initial_load_path is the working directory's, as every other path is;
  // made absolute here so that the logs and a saved config name the directory that was used.
  auto& initial = c.checkpoint.initial_load_path;
  if (!initial.empty()) initial = io::absolute_path(initial);
  validate(c);
  check_no_dead_options(c, base);
  if (check_model) check_model(c);
  if (!c.debug.save_config_file.empty()) {
    // The resolved config: a job file it came from is already merged in, so the saved file names
    // none (job files do not nest). Written through a temporary name, checked, then renamed.
    JobConfig saved = c;
    saved.job.config_file.clear();
    const std::string head =
        c.job.config_file.empty()
            ? std::string()
            : "# resolved config; includes the job file '" + c.job.config_file + "'\n";
    try {
      io::write_file_atomic(c.debug.save_config_file, {head, to_string(saved)});
    } catch (const Error& e) {
      throw Error(std::string("debug.save_config_file: ") + e.what());
    }
  }
  return c;
}

void validate(const JobConfig& c) {
  const auto& t = c.training;
  check(t.local_batch_size > 0, "training.local_batch_size must be positive");
  check(t.seq_len > 0, "training.seq_len must be positive");
  check(t.steps > 0, "training.steps must be positive");
  check(t.max_norm > 0, "training.max_norm must be positive");
  check(t.mixed_precision_param == "bfloat16" || t.mixed_precision_param == "float32",
        "training.mixed_precision_param '" + t.mixed_precision_param +
            "' is not a known dtype; use bfloat16 or float32");
  check(t.mixed_precision_reduce == "float32",
        "training.mixed_precision_reduce '" + t.mixed_precision_reduce +
            "' is not supported; gradients are reduced in float32 (use float32)");
  check(t.dtype == "float32" || t.dtype == "bfloat16",
        "training.dtype '" + t.dtype + "' is not a known dtype; use float32 or bfloat16");
  check(t.dtype == "float32" || t.mixed_precision_param == "bfloat16",
        "training.dtype bfloat16 (bf16 master weights) computes in bf16, but "
        "training.mixed_precision_param is '" +
            t.mixed_precision_param + "'; set it to bfloat16");
  check(!t.device.empty(), "training.device is empty; use cpu or cuda");
  check(t.global_batch_size == -1 || t.global_batch_size > 0,
        "training.global_batch_size must be positive (or -1: local_batch_size × data-parallel "
        "degree), got " +
            std::to_string(t.global_batch_size));
  check(t.global_batch_size == -1 || t.global_batch_size % t.local_batch_size == 0,
        "training.global_batch_size (" + std::to_string(t.global_batch_size) +
            ") must be -1 or a multiple of training.local_batch_size (" +
            std::to_string(t.local_batch_size) + ")");
  const auto& o = c.optimizer;
  check(o.name == "AdamW", "optimizer.name '" + o.name + "' is not supported; use AdamW");
  // torch.optim.AdamW's checks, in its words.
  check(o.lr >= 0,
        "optimizer.lr must not be negative (Invalid learning rate: " + shortest(o.lr) + ")");
  check(o.eps >= 0,
        "optimizer.eps must not be negative (Invalid epsilon value: " + shortest(o.eps) + ")");
  check(o.beta1 >= 0 && o.beta1 < 1,
        "optimizer.beta1 must be in [0, 1) (Invalid beta parameter at index 0: " +
            shortest(o.beta1) + ")");
  check(o.beta2 >= 0 && o.beta2 < 1,
        "optimizer.beta2 must be in [0, 1) (Invalid beta parameter at index 1: " +
            shortest(o.beta2) + ")");
  check(o.weight_decay >= 0,
        "optimizer.weight_decay must not be negative (Invalid weight_decay value: " +
            shortest(o.weight_decay) + ")");
  const std::string& im = o.implementation;
  check(im == "fused" || im == "foreach" || im == "for-loop" || im == "fused_opt_states_bf16",
        "optimizer.implementation '" + im +
            "' must be for-loop, foreach, fused or fused_opt_states_bf16");
  check(o.state_dtype.empty() || o.state_dtype == "float32" || o.state_dtype == "bfloat16" ||
            o.state_dtype == "int8",
        "optimizer.state_dtype '" + o.state_dtype + "' must be float32, bfloat16 or int8");
  check(im != "fused_opt_states_bf16" || o.moments_dtype() == "bfloat16",
        "optimizer.implementation fused_opt_states_bf16 keeps the moments in bfloat16, but "
        "optimizer.state_dtype is " +
            o.state_dtype + "; drop one of the two");
  check(c.lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps must not be negative");
  check(c.lr_scheduler.min_lr_factor >= 0 && c.lr_scheduler.min_lr_factor <= 1,
        "lr_scheduler.min_lr_factor must be in [0, 1] (the floor of the decay as a fraction of "
        "optimizer.lr), got " +
            shortest(c.lr_scheduler.min_lr_factor));
  const std::string& dt = c.lr_scheduler.decay_type;
  check(dt == "linear" || dt == "sqrt" || dt == "cosine",
        "lr_scheduler.decay_type '" + dt + "' must be linear, sqrt or cosine");
  check(c.lr_scheduler.decay_ratio < 0 || c.lr_scheduler.decay_ratio <= 1,
        "lr_scheduler.decay_ratio must be in [0, 1] (or negative for none)");
  check(c.metrics.log_freq > 0, "metrics.log_freq must be positive");
  check(c.metrics.peak_flops >= 0,
        "metrics.peak_flops must be positive (FLOP/s), or 0 to measure it at start; got " +
            shortest(c.metrics.peak_flops));
  check(!c.metrics.enable_tensorboard || !c.metrics.save_tb_folder.empty(),
        "metrics.save_tb_folder must not be empty with metrics.enable_tensorboard (default: tb)");
  check(c.loss.num_chunks > 0, "loss.num_chunks must be positive");
  const auto& ac = c.activation_checkpoint;
  check(ac.mode == "none" || ac.mode == "selective" || ac.mode == "full",
        "activation_checkpoint.mode '" + ac.mode + "' must be none, selective or full");
  if (ac.mode == "selective" && ac.selective_ac_option != "op") {
    const std::string& o = ac.selective_ac_option;
    check(!o.empty() && o.size() < 10 && o.find_first_not_of("0123456789") == std::string::npos &&
              std::stoll(o) > 0,
          "activation_checkpoint.selective_ac_option '" + o +
              "' must be a positive integer N (every N-th block) or op");
  }
  const auto& k = c.checkpoint;
  check(k.interval >= 1, "checkpoint.interval must be at least 1");
  check(k.load_step >= -1,
        "checkpoint.load_step must be a step number, or -1 for the latest; got " +
            std::to_string(k.load_step));
  check(k.keep_latest_k == 0 || k.keep_latest_k >= 2,
        "checkpoint.keep_latest_k must be 0 (keep all) or at least 2");
  check(!k.initial_load_in_hf || k.initial_load_model_only,
        "checkpoint.initial_load_in_hf requires checkpoint.initial_load_model_only");
  check(!k.last_save_in_hf || k.last_save_model_only,
        "checkpoint.last_save_in_hf requires checkpoint.last_save_model_only");
  check(k.export_dtype == "float32" || k.export_dtype == "bfloat16" || k.export_dtype == "float16",
        "checkpoint.export_dtype '" + k.export_dtype + "' must be float32, bfloat16 or float16");
  check(!k.initial_load_in_hf || !k.initial_load_path.empty() || !c.model.hf_assets_path.empty(),
        "checkpoint.initial_load_in_hf needs checkpoint.initial_load_path or model.hf_assets_path");
  check(!c.dataloader.tokenizer.empty(),
        "dataloader.tokenizer is empty; use auto, byte or a tokenizer.json path");
  check(!c.dataloader.text_field.empty(), "dataloader.text_field must name a JSON field");
  check(c.dpo.loss_type == "sigmoid" || c.dpo.loss_type == "ipo" || c.dpo.loss_type == "hinge" ||
            c.dpo.loss_type == "robust",
        "dpo.loss_type '" + c.dpo.loss_type + "' must be sigmoid, ipo, hinge or robust");
  check(std::isfinite(c.dpo.beta) && c.dpo.beta > 0,
        "dpo.beta must be a positive number, got " + shortest(c.dpo.beta));
  check(c.dpo.label_smoothing >= 0 && c.dpo.label_smoothing < 0.5,
        "dpo.label_smoothing must be in [0, 0.5), got " + shortest(c.dpo.label_smoothing));
  check(!c.dpo.enable || !c.validator.enable,
        "validator.enable computes the next-token loss, which DPO does not train: turn the "
        "validator off with dpo.enable");
  check(c.dpo.label_smoothing == 0 || c.dpo.loss_type == "robust",
        "dpo.label_smoothing applies to loss_type robust only (TRL's sigmoid loss has none)");
  check(c.sft.truncation == "truncate" || c.sft.truncation == "drop",
        "sft.truncation '" + c.sft.truncation + "' must be truncate or drop");
  check(c.sft.packing_strategy == "bfd" || c.sft.packing_strategy == "wrapped",
        "sft.packing_strategy '" + c.sft.packing_strategy + "' must be bfd or wrapped");
  check(c.eval.logits_out.empty() || !c.eval.tokens_path.empty(),
        "eval.logits_out needs eval.tokens_path (the logits are written for the token ids in "
        "that file)");
  const auto& lo = c.lora;
  check(lo.rank >= 0,
        "lora.rank must be 0 (no adapters) or positive, got " + std::to_string(lo.rank));
  check(lo.dropout >= 0 && lo.dropout < 1,
        "lora.dropout must be in [0, 1), got " + shortest(lo.dropout));
  check(lo.rank == 0 || (std::isfinite(lo.alpha) && lo.alpha > 0),
        "lora.alpha must be positive (the adapters are scaled by alpha / rank), got " +
            shortest(lo.alpha));
  dataset_weights(c);
  const auto& vc = c.validator;
  check(vc.freq > 0, "validator.freq must be positive");
  check(vc.steps == -1 || vc.steps > 0, "validator.steps must be -1 (the whole set) or positive");
  check(!vc.enable || !vc.dataset_path.empty(),
        "validator.enable needs validator.dataset_path (the validation corpus)");
}

std::vector<double> dataset_weights(const JobConfig& c) {
  std::vector<double> w;
  const std::string& text = c.dataloader.dataset_weights;
  if (text.empty()) return w;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    char* end = nullptr;
    const double v = item.empty() ? 0 : std::strtod(item.c_str(), &end);
    check(!item.empty() && end == item.c_str() + item.size() && std::isfinite(v) && v > 0,
          "dataloader.dataset_weights: '" + item +
              "' is not a positive number; give one positive weight per item of "
              "dataloader.dataset_path, e.g. 0.7,0.3");
    w.push_back(v);
  }
  return w;
}

namespace {
std::map<std::string, ConfigFn>& registry() {
  static std::map<std::string, ConfigFn> r;
  return r;
}
}  // namespace

void register_config(const std::string& name, ConfigFn fn) { registry()[name] = std::move(fn); }

std::vector<std::string> config_names() {
  std::vector<std::string> n;
  for (const auto& [k, v] : registry()) n.push_back(k);
  return n;
}

JobConfig make_config(const std::string& name) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string names;
    for (const auto& n : config_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("unknown config '" + name + "'; available: " + names);
  }
  return it->second();
}

}  // namespace titan::config
