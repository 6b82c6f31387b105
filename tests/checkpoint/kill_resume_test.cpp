// Kill/resume: a short training run with checkpoints (the titan binary, a tiny model) is killed
// with SIGKILL at named moments (TITAN_TEST_KILL_AT, core/test_hooks.h): during a step, after
// each file of a save and half-way through one, while replacing or purging a step, during the
// final export, half-way through a metrics line and while trimming metrics.jsonl. Each trial is
// then run again to the end; it must finish with bitwise the uninterrupted run's per-step losses,
// grad norms and learning rates (metrics.jsonl, each step once) and final weights, with no
// temporary file or folder left anywhere in the dump folder.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;

struct Outcome {
  int status = 0;
  std::string log;
};

// Runs titan with args; kill_at / disable set TITAN_TEST_KILL_AT / TITAN_TEST_DISABLE.
Outcome titan(const std::vector<std::string>& args, const std::string& log_path,
              const std::string& kill_at = "", const std::string& disable = "") {
  const pid_t pid = fork();
  if (pid == 0) {
    if (kill_at.empty())
      unsetenv("TITAN_TEST_KILL_AT");
    else
      setenv("TITAN_TEST_KILL_AT", kill_at.c_str(), 1);
    setenv("OMP_NUM_THREADS", "1", 1);  // a tiny model; fast on a loaded machine
    if (disable.empty())
      unsetenv("TITAN_TEST_DISABLE");
    else
      setenv("TITAN_TEST_DISABLE", disable.c_str(), 1);
    FILE* f = std::freopen(log_path.c_str(), "w", stdout);
    if (!f || dup2(fileno(stdout), 2) < 0) _exit(127);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(TITAN_BINARY));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(TITAN_BINARY, argv.data());
    _exit(127);
  }
  Outcome r;
  waitpid(pid, &r.status, 0);
  std::ifstream in(log_path);
  r.log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

std::vector<std::string> job(const std::string& dump, const std::string& corpus) {
  return {"train",
          "--config",
          "qwen3_debugmodel",
          "--model.n_layers",
          "2",
          "--model.dim",
          "32",
          "--model.n_heads",
          "4",
          "--model.n_kv_heads",
          "2",
          "--model.head_dim",
          "16",
          "--model.hidden_dim",
          "64",
          "--model.vocab_size",
          "260",
          "--training.steps",
          "8",
          "--training.seq_len",
          "32",
          "--training.local_batch_size",
          "2",
          "--lr_scheduler.warmup_steps",
          "2",
          "--metrics.log_freq",
          "1",
          "--metrics.peak_flops",
          "1e11",
          "--dataloader.dataset",
          "text",
          "--dataloader.dataset_path",
          corpus,
          "--checkpoint.enable",
          "--checkpoint.interval",
          "2",
          "--checkpoint.keep_latest_k",
          "2",
          "--dump_folder",
          dump};
}

// (step, loss, grad_norm, lr) of every metrics record, as text (bitwise: JSON keeps 17 digits).
std::vector<std::string> metrics(const std::string& dump) {
  std::vector<std::string> r;
  std::ifstream f(dump + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    r.push_back(j["step"].dump() + " " + j["loss"].dump() + " " + j["grad_norm"].dump() + " " +
                j["lr"].dump());
  }
  return r;
}

std::string bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<std::string> temporaries(const std::string& dump) {
  std::vector<std::string> r;
  for (const auto& e : fs::recursive_directory_iterator(dump)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp") != std::string::npos || n.find(".old-") != std::string::npos ||
        n.find(".del-") != std::string::npos)
      r.push_back(e.path().string());
  }
  return r;
}

struct Kill {
  Kill(std::string at_, std::vector<std::string> args_ = {}, std::string disable_ = "")
      : at(std::move(at_)), args(std::move(args_)), disable(std::move(disable_)) {}
  std::string at;                 // TITAN_TEST_KILL_AT ("": this run is not killed)
  std::vector<std::string> args;  // extra flags of the run
  std::string disable;            // TITAN_TEST_DISABLE
};
struct Trial {
  std::string name;
  std::vector<Kill> kills;         // runs, each killed
  std::vector<std::string> final;  // extra flags of the run to the end
};

TEST(KillResume, EveryKillPointResumesBitwiseIdentically) {
  const std::string root = titan::testing::fresh_temp_dir("kill");
  const std::string corpus = root + "/corpus.txt";
  {
    std::ofstream o(corpus);
    for (int i = 0; i < 40; ++i) o << "line " << i << " of the kill test corpus, some words\n";
  }
  const std::string ref = root + "/reference";
  Outcome r = titan(job(ref, corpus), root + "/reference.log");
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.log;
  const auto want_metrics = metrics(ref);
  ASSERT_EQ(want_metrics.size(), 8u);
  const std::string want_weights = bytes(ref + "/checkpoint/step-8/model.safetensors");
  ASSERT_FALSE(want_weights.empty());

  const std::vector<std::string> load4 = {"--checkpoint.load_step", "4"};
  const std::vector<Trial> trials = {
      {"before any checkpoint", {{"step:backward@1"}}, {}},
      {"mid-step after a save", {{"step:backward@3"}}, {}},
      {"after model.safetensors", {{"save:model@2"}}, {}},
      {"after optimizer.safetensors", {{"save:optimizer@2"}}, {}},
      {"after train_state.json", {{"save:train_state@2"}}, {}},
      {"after checksums.json", {{"save:checksums@2"}}, {}},
      {"half-way through model.safetensors", {{"write:partial@3"}}, {}},
      {"half-way through optimizer.safetensors", {{"write:partial@4"}}, {}},
      {"while purging step-2", {{"save:purge@1"}}, {}},
      {"during the final export", {{"export:model@1"}}, {}},
      {"half-way through the final export file", {{"write:partial@7"}}, {}},
      {"half-way through a metrics line", {{"metrics:partial@5"}}, {}},
      {"twice: mid-step, then while trimming metrics.jsonl",
       {{"step:backward@4"}, {"metrics:rewrite@1"}},
       {}},
      {"twice: in a save, then in the next run's save",
       {{"save:optimizer@2"}, {"save:train_state@1"}},
       {}},
      {"replacing an existing step (renameat2 exchange)",
       {Kill(""), Kill("save:replace@1", load4)},
       load4},
      {"replacing an existing step (two renames)",
       {Kill(""), Kill("save:replace@1", load4, "rename_exchange")},
       load4},
  };
  int kills = 0;
  for (size_t t = 0; t < trials.size(); ++t) {
    const Trial& trial = trials[t];
    SCOPED_TRACE(trial.name);
    const std::string dump = root + "/trial" + std::to_string(t);
    for (size_t k = 0; k < trial.kills.size(); ++k) {
      const Kill& kill = trial.kills[k];
      auto args = job(dump, corpus);
      args.insert(args.end(), kill.args.begin(), kill.args.end());
      const std::string log = dump + "." + std::to_string(k) + ".log";
      fs::create_directories(dump);
      Outcome run = titan(args, log, kill.at, kill.disable);
      if (kill.at.empty()) {
        ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.log;
      } else {
        ASSERT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == SIGKILL)
            << kill.at << " was not reached:\n"
            << run.log;
        ++kills;
      }
    }
    auto args = job(dump, corpus);
    args.insert(args.end(), trial.final.begin(), trial.final.end());
    Outcome run = titan(args, dump + ".final.log");
    ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.log;
    EXPECT_EQ(metrics(dump), want_metrics) << run.log;
    EXPECT_TRUE(bytes(dump + "/checkpoint/step-8/model.safetensors") == want_weights) << run.log;
    EXPECT_EQ(temporaries(dump), std::vector<std::string>{}) << run.log;
  }
  std::printf("%d kills in %zu trials, each resumed to the reference result\n", kills,
              trials.size());
}

}  // namespace
