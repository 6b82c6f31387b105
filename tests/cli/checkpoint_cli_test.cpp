// Checkpoints from the command line: each problem is one "titan: error:" line and exit 1 (never
// a crash, an internal error or a silent success), and a finished job started again is a no-op.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "test_util.h"

namespace {

using Result = ::titan::testing::CliResult;
Result titan(const std::string& args) { return ::titan::testing::run_titan(args); }

// one_line: the error is all that is printed (false where log lines legitimately precede it).
void expect_error(const std::string& args, const std::string& needle, bool one_line = true) {
  Result r = titan(args);
  EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
  const size_t at = r.out.find("titan: error: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle, at), std::string::npos) << "missing '" << needle << "' in:\n"
                                                       << r.out;
  EXPECT_EQ(r.out.find('\n', at), r.out.size() - 1) << "the error is one last line:\n" << r.out;
  if (one_line) {
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

std::string temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("titan_cli_ckpt_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// Checkpoint and output-folder problems are one error line, never a crash or a silent success:
// an empty dump_folder, a resumed train_state.json with a cursor past the dataset (read out of
// bounds before) or a step of the wrong type, a re-run of a finished job (a no-op).
TEST(CliCheckpoint, ProblemsAreOneLine) {
  const std::string d = temp_dir();
  {
    std::ofstream o(d + "/corpus.txt");
    for (int i = 0; i < 30; ++i) o << "line " << i << " of the checkpoint cli corpus\n";
  }
  const std::string job =
      "train --config qwen3_debugmodel --model.n_layers 1 --model.dim 64 --training.steps 2 "
      "--training.seq_len 32 --training.local_batch_size 2 --metrics.peak_flops 1e11 "
      "--dataloader.dataset text --dataloader.dataset_path " +
      d + "/corpus.txt --checkpoint.enable --checkpoint.interval 1 --dump_folder ";
  expect_error(job + "''", "dump_folder is empty");
  Result r = titan(job + d + "/run --checkpoint.last_save_model_only false");
  ASSERT_EQ(r.code, 0) << r.out;
  r = titan(job + d + "/run --checkpoint.last_save_model_only false");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Already at step 2 = training.steps; nothing to train"), std::string::npos)
      << r.out;
  const std::string st = d + "/run/checkpoint/step-2/train_state.json";
  std::filesystem::remove(d + "/run/checkpoint/step-2/checksums.json");
  nlohmann::json j;
  std::ifstream(st) >> j;
  j["dataloader"]["cursor"] = 1 << 30;
  std::ofstream(st) << j.dump();
  expect_error(job + d + "/run --training.steps 3",
               st + ": dataloader state: \"cursor\" 1073741824 is outside [0, 30]", false);
  j["step"] = "2";
  std::ofstream(st) << j.dump();
  expect_error(job + d + "/run --training.steps 3",
               st + ": \"step\" must be a non-negative integer, got \"2\"", false);
}

// `titan train --config qwen3_debugmodel ARGS` in a fresh dump folder (removed after); its log.
std::string train_log(const std::string& args) {
  const std::string d = temp_dir() + "_train";
  const Result r = titan("train --config qwen3_debugmodel " + args + " --dump_folder " + d);
  std::filesystem::remove_all(d);
  EXPECT_EQ(r.code, 0) << r.out;
  return r.out;
}

// A LoRA run's Hugging Face save is the PEFT adapter, and the log says so.
TEST(CliCheckpoint, LoraSaveIsLoggedAsTheAdapter) {
  const std::string out = train_log(
      "--training.steps 2 --lora.rank 4 --checkpoint.enable --checkpoint.last_save_in_hf");
  EXPECT_NE(out.find("Saved the LoRA adapter (float32, PEFT) to "), std::string::npos) << out;
  EXPECT_EQ(out.find("Saved the model"), std::string::npos) << out;
}

// A run that loads nothing says that its weights are a seeded random init.
TEST(CliCheckpoint, RandomInitIsLogged) {
  const std::string out = train_log("--training.steps 1 --debug.seed 5");
  EXPECT_NE(out.find("Weights: random init with seed 5 "), std::string::npos) << out;
}

// A relative checkpoint.initial_load_path is the working directory's, and the log names the
// absolute path that was loaded.
TEST(CliCheckpoint, RelativeInitialLoadPathIsTheWorkingDirectorys) {
  const std::string d = temp_dir() + "_relative";
  const Result made = titan(
      "train --config qwen3_debugmodel --training.steps 1 --checkpoint.enable "
      "--dump_folder " +
      d + "/run");
  ASSERT_EQ(made.code, 0) << made.out;
  const Result r = ::titan::testing::run_titan(
      "generate --config qwen3_debugmodel --dataloader.tokenizer byte --prompt 'The ' --greedy "
      "--max_new_tokens 2 --checkpoint.initial_load_path run/checkpoint/step-1",
      d);
  std::filesystem::remove_all(d);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Weights: loaded from " + d + "/run/checkpoint/step-1"), std::string::npos)
      << r.out;
}

}  // namespace
