#include "titan/config/job_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

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
