#include "titan/config/job_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "test_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/spec.h"

namespace titan::config {
namespace {

std::string error_of(JobConfig& c, const std::vector<std::string>& args) {
  try {
    apply_flags(c, args);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JobConfig, FlagFormsAndPrecedence) {
  register_builtin_configs();
  JobConfig c = make_config("qwen3_debugmodel");
  EXPECT_EQ(c.training.seq_len, 256);  // the config function's value
  apply_flags(
      c, {"--training.seq_len", "128", "--optimizer.lr=1e-3", "--metrics.disable_color_printing",
          "--dataloader.shuffle", "false", "--model.flavor", "0.6B"});
  EXPECT_EQ(c.training.seq_len, 128);  // flags win over the config function
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.metrics.disable_color_printing);
  EXPECT_FALSE(c.dataloader.shuffle);
  EXPECT_EQ(c.model.flavor, "0.6B");
  apply_flags(c, {"--training.seq_len=64", "--training.seq_len", "32"});  // last one wins
  EXPECT_EQ(c.training.seq_len, 32);
}

// Each value is checked where it enters, and every kind of mistake below, walked over several
// fields and values, is refused in one line naming the field.
TEST(JobConfig, FlagMistakesAreRefusedWhereTheyEnter) {
  register_builtin_configs();
  JobConfig c = make_config("qwen3_debugmodel");
  // A flag given twice with different values: the last one is used, with a warning.
  for (const auto& [a, v, b] : {std::tuple{"--training.steps", "5", "--training.steps=6"},
                                {"--model.flavor", "0.6B", "--model.flavor=4B"},
                                {"--dataloader.shuffle", "1", "--dataloader.shuffle=false"}}) {
    ::testing::internal::CaptureStdout();
    EXPECT_EQ(error_of(c, {a, v, b}), "");
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find(std::string(a) + " is given twice, as '" + v + "' and then '"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("': the last one is used"), std::string::npos) << out;
  }
  EXPECT_EQ(c.training.steps, 6);
  EXPECT_EQ(c.model.flavor, "4B");
  EXPECT_FALSE(c.dataloader.shuffle);
  // A boolean flag followed by a word that is not a boolean.
  for (const char* word : {"yes", "no", "on", "2"}) {
    const std::string e = error_of(c, {"--debug.print_config", word});
    EXPECT_NE(e.find("--debug.print_config expects true or false (or True, False, 1, 0), got '" +
                     std::string(word) + "'"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(
      error_of(c, {"--debug.print_config", "0", "--metrics.enable_jsonl", "--training.steps", "3"}),
      "");
  // An explicit 0 for a field where 0 means "not given" (the model's size overrides).
  for (const char* f : {"--model.n_layers", "--model.dim", "--model.n_heads", "--model.vocab_size",
                        "--model.rope_theta", "--model.num_experts", "--model.top_k"})
    for (const char* zero : {"0", "0.0", "-0"}) {
      if (std::string(zero) != "0" && std::string(f) != "--model.rope_theta") continue;
      const std::string e = error_of(c, {f, zero});
      EXPECT_NE(e.find(std::string(f) + " " + zero + " is not a valid value"), std::string::npos)
          << e;
    }
}

// Options that would do nothing in the run are refused, naming the option and what gives it an
// effect; the same values with their effect are accepted.
TEST(JobConfig, OptionsWithoutEffectAreRefused) {
  register_builtin_configs();
  auto build = [](const std::vector<std::string>& flags) {
    return titan::testing::error_of([&] { build_job_config("qwen3_debugmodel", flags); });
  };
  for (const auto& [flag, value] : {std::pair{"--lora.alpha", "8"},
                                    {"--lora.dropout", "0.1"},
                                    {"--lora.target_modules", "wq"},
                                    {"--lora.use_rslora", "true"}}) {
    const std::string e = build({flag, value});
    EXPECT_NE(e.find(std::string(flag).substr(2) + " has no effect without adapters"),
              std::string::npos)
        << e;
    EXPECT_EQ(build({flag, value, "--lora.rank", "4"}), "");
  }
  for (const char* step : {"0", "3"}) {
    EXPECT_NE(build({"--checkpoint.load_step", step}).find("has no effect with checkpoint.enable"),
              std::string::npos);
    EXPECT_EQ(build({"--checkpoint.load_step", step, "--checkpoint.enable"}), "");
  }
  for (const char* mode : {"none", "full"})
    EXPECT_NE(build({"--activation_checkpoint.mode", mode,
                     "--activation_checkpoint.selective_ac_option", "op"})
                  .find("selective_ac_option 'op' has no effect with activation_checkpoint.mode " +
                        std::string(mode)),
              std::string::npos);
  EXPECT_EQ(build({"--activation_checkpoint.mode", "selective",
                   "--activation_checkpoint.selective_ac_option", "op"}),
            "");
  // Ranges checked where the value enters.
  EXPECT_NE(build({"--metrics.peak_flops", "-1"}).find("metrics.peak_flops must be positive"),
            std::string::npos);
  for (const char* step : {"-2", "-100"})
    EXPECT_NE(build({"--checkpoint.enable", "--checkpoint.load_step", step})
                  .find("checkpoint.load_step must be a step number, or -1"),
              std::string::npos);
  for (const char* alpha : {"0", "-1"})
    EXPECT_NE(
        build({"--lora.rank", "4", "--lora.alpha", alpha}).find("lora.alpha must be positive"),
        std::string::npos);
}

TEST(JobConfig, Errors) {
  JobConfig c;
  EXPECT_NE(error_of(c, {"--training.sq_len", "3"}).find("did you mean --training.seq_len"),
            std::string::npos);
  EXPECT_NE(error_of(c, {"--training.steps", "1.5"}).find("expects an integer"), std::string::npos);
  EXPECT_NE(error_of(c, {"--training.steps", "99999999999999999999"}).find("expects an integer"),
            std::string::npos);
  EXPECT_NE(error_of(c, {"--optimizer.lr", "nan"}).find("expects a number"), std::string::npos);
  EXPECT_NE(error_of(c, {"--metrics.enable_jsonl=maybe"}).find("expects true or false"),
            std::string::npos);
  EXPECT_NE(error_of(c, {"--training.steps"}).find("needs a value"), std::string::npos);
  EXPECT_NE(error_of(c, {"training.steps"}).find("unexpected argument"), std::string::npos);
}

TEST(JobConfig, ReflectionCoversEveryFieldOnce) {
  JobConfig c;
  std::vector<Field> fs = fields(c);
  std::set<std::string> names;
  for (const auto& f : fs) EXPECT_TRUE(names.insert(f.name).second) << f.name;
  EXPECT_TRUE(names.count("training.local_batch_size"));
  EXPECT_TRUE(names.count("lr_scheduler.decay_type"));
  std::string text = to_string(c);
  EXPECT_NE(text.find("[training]\n"), std::string::npos);
  EXPECT_NE(text.find("decay_type = \"linear\""), std::string::npos);
}

TEST(JobConfig, ResolveModelAppliesOverrides) {
  JobConfig c;
  c.model.flavor = "0.6B";
  c.model.n_layers = 2;
  qwen3::Qwen3Args a = qwen3::args_from_config(c);
  EXPECT_EQ(a.n_layers, 2);
  EXPECT_EQ(a.dim, 1024);
  EXPECT_EQ(a.vocab_size, 151936);
  EXPECT_TRUE(a.tie_embeddings);
  c.model.n_kv_heads = 3;
  EXPECT_THROW(qwen3::args_from_config(c), Error);  // 16 heads are not a multiple of 3
}

TEST(JobConfig, ValidateCrossFieldRules) {
  // The config's own rules, then the model's (seq_len against the flavor's context).
  auto validate = [](const JobConfig& c) {
    config::validate(c);
    models::validate_model_config(c);
  };
  JobConfig c;
  c.training.seq_len = 4096;
  EXPECT_NO_THROW(validate(c));
  c.training.seq_len = 4097;
  EXPECT_THROW(validate(c), Error);
  c.training.seq_len = 256;
  c.training.local_batch_size = 4;
  c.training.global_batch_size = 6;
  EXPECT_THROW(validate(c), Error);
  c.training.global_batch_size = 8;
  EXPECT_NO_THROW(validate(c));
  c.lr_scheduler.decay_type = "step";
  EXPECT_THROW(validate(c), Error);
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / ("titan_cfg_" + std::to_string(getpid()));
  std::filesystem::create_directories(p);
  std::ofstream(p / name) << text;
  return (p / name).string();
}

TEST(JobConfig, TomlSitsBetweenFunctionAndFlags) {
  register_builtin_configs();
  std::string f = write_temp("job.toml", R"(dump_folder = "/tmp/x"
[training]
steps = 33
seq_len = 128
max_norm = 2
[optimizer]
lr = 1e-3
[metrics]
disable_color_printing = true
)");
  JobConfig c =
      build_job_config("qwen3_debugmodel", {"--training.steps", "44", "--job.config_file", f});
  EXPECT_EQ(c.training.steps, 44);     // flag beats TOML, wherever it stands
  EXPECT_EQ(c.training.seq_len, 128);  // TOML beats the config function
  EXPECT_DOUBLE_EQ(c.training.max_norm, 2.0);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.metrics.disable_color_printing);
  EXPECT_EQ(c.dump_folder, "/tmp/x");
  EXPECT_EQ(c.training.local_batch_size, 4);  // untouched: the function's value
}

TEST(JobConfig, SavedConfigReadsBackIdentically) {
  register_builtin_configs();
  std::string out = write_temp("saved.toml", "");
  JobConfig a =
      build_job_config("qwen3_debugmodel", {"--optimizer.lr", "3e-4", "--dump_folder",
                                            "a \"quoted\" dir", "--debug.save_config_file", out});
  JobConfig b =
      build_job_config("qwen3_0_6b", {"--job.config_file", out, "--debug.save_config_file", ""});
  a.debug.save_config_file.clear();
  b.job.config_file.clear();
  EXPECT_EQ(to_string(a), to_string(b));
}

// debug.save_config_file goes through the checked, atomic writer: an unwritable path is one
// error naming the field and the file (it was an unchecked rename of a ".tmp" file).
TEST(JobConfig, SaveConfigFileFailureNamesTheField) {
  register_builtin_configs();
  const std::string out = "/nonexistent_dir_for_titan_test/saved.toml";
  try {
    build_job_config("qwen3_debugmodel", {"--debug.save_config_file", out});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("debug.save_config_file"), std::string::npos) << msg;
    EXPECT_NE(msg.find(out), std::string::npos) << msg;
  }
}

TEST(JobConfig, TomlErrorsNameFileLineAndKey) {
  auto err = [](const std::string& text) {
    JobConfig c;
    try {
      apply_toml_file(c, write_temp("bad.toml", text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("[training]\nstpes = 3\n")
                .find("bad.toml:2: unknown key 'training.stpes'; did you mean 'training.steps'"),
            std::string::npos);
  EXPECT_NE(err("[training]\nsteps = \"many\"\n").find("training.steps expects an integer"),
            std::string::npos);
  EXPECT_NE(err("[training\nsteps = 3\n").find("bad.toml:1"), std::string::npos);
}

// Values torch.optim.AdamW refuses, and a schedule floor above the peak, were accepted.
TEST(JobConfig, OptimizerAndScheduleRanges) {
  auto msg = [](void (*edit)(JobConfig&)) {
    JobConfig c;
    edit(c);
    return titan::testing::error_of([&] { validate(c); });
  };
  EXPECT_EQ(msg([](JobConfig&) {}), "");
  EXPECT_NE(msg([](JobConfig& c) {
              c.optimizer.beta1 = 1.0;
            }).find("optimizer.beta1 must be in [0, 1) (Invalid beta parameter at index 0: 1)"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) { c.optimizer.beta1 = -0.1; }).find("optimizer.beta1"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) {
              c.optimizer.beta2 = -0.5;
            }).find("Invalid beta parameter at index 1: -0.5"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) { c.optimizer.beta2 = 1.0; }).find("optimizer.beta2"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) {
              c.optimizer.weight_decay = -0.1;
            }).find("optimizer.weight_decay must not be negative"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) { c.optimizer.eps = -1e-8; }).find("optimizer.eps"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) {
              c.lr_scheduler.min_lr_factor = 1.5;
            }).find("lr_scheduler.min_lr_factor must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(msg([](JobConfig& c) {
              c.lr_scheduler.min_lr_factor = -0.5;
            }).find("lr_scheduler.min_lr_factor"),
            std::string::npos);
  EXPECT_EQ(msg([](JobConfig& c) {
              c.optimizer.beta1 = 0;
              c.lr_scheduler.min_lr_factor = 1;
            }),
            "");
}

// The precision fields: torchtitan's names and defaults; unknown or unimplemented values are
// refused with the field and the valid values.
TEST(JobConfig, PrecisionFields) {
  JobConfig c;
  EXPECT_EQ(c.training.mixed_precision_param, "bfloat16");
  EXPECT_EQ(c.training.mixed_precision_reduce, "float32");
  EXPECT_EQ(c.training.dtype, "float32");
  EXPECT_NO_THROW(validate(c));
  c.training.mixed_precision_param = "fp16";
  std::string m = titan::testing::error_of([&] { validate(c); });
  EXPECT_EQ(m,
            "training.mixed_precision_param 'fp16' is not a known dtype; use bfloat16 or float32");
  c = JobConfig{};
  c.training.dtype = "bfloat16";
  EXPECT_NO_THROW(validate(c));
  c.training.dtype = "float16";
  m = titan::testing::error_of([&] { validate(c); });
  EXPECT_EQ(m, "training.dtype 'float16' is not a known dtype; use float32 or bfloat16");
  c = JobConfig{};
  c.training.mixed_precision_reduce = "bfloat16";
  m = titan::testing::error_of([&] { validate(c); });
  EXPECT_NE(m.find("training.mixed_precision_reduce 'bfloat16' is not supported"),
            std::string::npos)
      << m;
}

// The optimizer state's dtype: torchtitan's implementation names (fused_opt_states_bf16 keeps the
// moments in bfloat16) and optimizer.state_dtype (float32, bfloat16, int8); other values and a
// contradiction are refused naming the field.
TEST(JobConfig, OptimizerStateDtype) {
  JobConfig c;
  EXPECT_EQ(c.optimizer.implementation, "fused");
  EXPECT_EQ(c.optimizer.moments_dtype(), "float32");
  c.optimizer.implementation = "fused_opt_states_bf16";
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.optimizer.moments_dtype(), "bfloat16");
  c.optimizer.state_dtype = "bfloat16";
  EXPECT_NO_THROW(validate(c));
  c.optimizer.implementation = "fused";
  c.optimizer.state_dtype = "int8";
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.optimizer.moments_dtype(), "int8");
  for (const auto& [impl, dtype, want] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"fused", "float16",
            "optimizer.state_dtype 'float16' must be float32, bfloat16 or int8"},
           {"fused", "uint8", "optimizer.state_dtype 'uint8' must be float32, bfloat16 or int8"},
           {"apex", "",
            "optimizer.implementation 'apex' must be for-loop, foreach, fused or "
            "fused_opt_states_bf16"},
           {"fused_opt_states_bf16", "float32",
            "optimizer.implementation fused_opt_states_bf16 keeps the moments in bfloat16, but "
            "optimizer.state_dtype is float32"}}) {
    c = JobConfig{};
    c.optimizer.implementation = impl;
    c.optimizer.state_dtype = dtype;
    const std::string m = titan::testing::error_of([&] { validate(c); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  }
}

// global_batch_size 0 said "must be -1 or a multiple of local_batch_size" (0 is a multiple).
TEST(JobConfig, GlobalBatchMustBePositive) {
  JobConfig c;
  c.training.global_batch_size = 0;
  const std::string m = titan::testing::error_of([&] { validate(c); });
  EXPECT_NE(m.find("training.global_batch_size must be positive (or -1"), std::string::npos) << m;
}

// eval.logits_out without eval.tokens_path was silently ignored.
TEST(JobConfig, LogitsOutNeedsTokensPath) {
  JobConfig c;
  c.eval.logits_out = "/tmp/logits.safetensors";
  EXPECT_NE(
      titan::testing::error_of([&] { validate(c); }).find("eval.logits_out needs eval.tokens_path"),
      std::string::npos);
  c.eval.tokens_path = "/tmp/ids.safetensors";
  EXPECT_EQ(titan::testing::error_of([&] { validate(c); }), "");
}

// 2^64-1 said only "expects an integer"; the value is an integer, just out of range.
TEST(JobConfig, OutOfRangeIntegerSaysSo) {
  JobConfig c;
  const std::string m = error_of(c, {"--model.vocab_size", "18446744073709551615"});
  EXPECT_NE(m.find("--model.vocab_size expects an integer, got '18446744073709551615', which is "
                   "out of range"),
            std::string::npos)
      << m;
  EXPECT_NE(error_of(c, {"--optimizer.lr", "1e999"}).find("out of range"), std::string::npos);
}

// The seed's three runs train as the seed does: 10 steps, one sequence per rank, on c4_test.
TEST(JobConfig, SeedRunsTrainTenStepsOnC4Test) {
  register_builtin_configs();
  for (const char* name : {"native_qwen3_4b", "v5_qwen3_4b", "nki_qwen3_30b_a3b"}) {
    const JobConfig c = make_config(name);
    EXPECT_EQ(c.training.steps, 10) << name;
    EXPECT_EQ(c.training.local_batch_size, 1) << name;
    EXPECT_EQ(c.dataloader.dataset, "c4_test") << name;
  }
}

// A TOML array for an integer field said "must be a list of strings".
TEST(JobConfig, TomlListForAScalarFieldNamesTheType) {
  JobConfig c;
  std::string m = titan::testing::error_of(
      [&] { apply_toml_file(c, write_temp("list.toml", "[training]\nsteps = [1, 2]\n")); });
  EXPECT_NE(m.find("list.toml:2: training.steps expects an integer, got a list"), std::string::npos)
      << m;
  m = titan::testing::error_of(
      [&] { apply_toml_file(c, write_temp("list.toml", "[optimizer]\nlr = [\"a\"]\n")); });
  EXPECT_NE(m.find("optimizer.lr expects a number, got a list"), std::string::npos) << m;
  // String fields that take lists still do.
  apply_toml_file(c, write_temp("list.toml", "[override]\nimports = [\"a.so\", \"b.so\"]\n"));
  EXPECT_EQ(c.override_.imports, "a.so,b.so");
  m = titan::testing::error_of(
      [&] { apply_toml_file(c, write_temp("list.toml", "[override]\nimports = [true]\n")); });
  EXPECT_NE(m.find("list.toml:2: override.imports must be a string or a list of strings"),
            std::string::npos)
      << m;
  // Weights are a list of numbers, one per dataset path.
  apply_toml_file(c, write_temp("list.toml",
                                "[dataloader]\ndataset_path = [\"a.txt\", \"b.jsonl\"]\n"
                                "dataset_weights = [0.75, 1]\n"));
  EXPECT_EQ(c.dataloader.dataset_path, "a.txt,b.jsonl");
  EXPECT_EQ(dataset_weights(c), (std::vector<double>{0.75, 1}));
  for (const char* bad : {"0.5,-1", "0.5,,1", "1,nan", "0", "1,x", "1e999"}) {
    c.dataloader.dataset_weights = bad;
    m = titan::testing::error_of([&] { validate(c); });
    EXPECT_NE(m.find("dataloader.dataset_weights: '"), std::string::npos) << bad << ": " << m;
  }
}

// --job.config_file naming a directory or /dev/zero, and a job file naming another, were ignored
// (or read forever).
TEST(JobConfig, JobFileMustBeOneRegularFile) {
  register_builtin_configs();
  const std::string dir = titan::testing::fresh_temp_dir("job_dir");
  std::string m = titan::testing::error_of([&] {
    build_job_config("qwen3_debugmodel", {"--job.config_file", dir});
  });
  EXPECT_NE(m.find("--job.config_file '" + dir + "' is not a regular file"), std::string::npos)
      << m;
  m = titan::testing::error_of(
      [&] { build_job_config("qwen3_debugmodel", {"--job.config_file=/dev/zero"}); });
  EXPECT_NE(m.find("'/dev/zero' is not a regular file"), std::string::npos) << m;
  const std::string inner = write_temp("inner.toml", "[training]\nsteps = 5\n");
  const std::string outer =
      write_temp("outer.toml", "[job]\nconfig_file = \"" + inner + "\"\n[training]\nsteps = 7\n");
  m = titan::testing::error_of([&] {
    build_job_config("qwen3_debugmodel", {"--job.config_file", outer});
  });
  EXPECT_NE(m.find("outer.toml:2: job.config_file inside a job file is not applied"),
            std::string::npos)
      << m;
  m = titan::testing::error_of([&] {
    build_job_config("qwen3_debugmodel", {"--job.config_file", inner, "--job.config_file", inner});
  });
  EXPECT_NE(m.find("--job.config_file given more than once"), std::string::npos) << m;
}

// A config saved from a run with a job file reads back (it names no job file: already merged).
TEST(JobConfig, SavedConfigOfAJobFileRunReadsBack) {
  register_builtin_configs();
  const std::string job = write_temp("job2.toml", "[training]\nsteps = 17\n");
  const std::string out = write_temp("saved2.toml", "");
  JobConfig a = build_job_config("qwen3_debugmodel",
                                 {"--job.config_file", job, "--debug.save_config_file", out});
  JobConfig b =
      build_job_config("qwen3_0_6b", {"--job.config_file", out, "--debug.save_config_file", ""});
  EXPECT_EQ(b.training.steps, 17);
  a.debug.save_config_file.clear();
  a.job.config_file.clear();
  b.job.config_file.clear();
  EXPECT_EQ(to_string(a), to_string(b));
}

TEST(JobConfig, UnknownConfigListsNames) {
  register_builtin_configs();
  try {
    make_config("qwen3_7b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3_debugmodel"), std::string::npos);
  }
  EXPECT_EQ(edit_distance("steps", "stpes"), 2u);
}

}  // namespace
}  // namespace titan::config
