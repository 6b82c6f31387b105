// What the multi-rank trainer tests share: shell runs of titan (alone and under mpirun), the
// fixture documents, a small training job, its metrics, and the check that two runs trained alike
// (per-step losses and gradient norms within 1e-5 relative, final parameters within 1e-5 of the
// largest |parameter| of each tensor).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/safetensors.h"

namespace titan::dist_test {

inline bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

struct ShellRun {
  int code;
  std::string out;
};
inline ShellRun sh(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline std::string mpirun(int np, const std::string& extra = "") {
  // One OpenMP thread per rank on this 2-core machine; --oversubscribe for 4 ranks.
  return "timeout 300 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) +
         " -x OMP_NUM_THREADS=1 " + extra + " ";
}

// A run that must stop with one clear line: a non-zero exit (not the timeout's), the message in
// its output.
inline void expect_refused(const std::string& cmd, const std::string& message) {
  SCOPED_TRACE(message);
  const ShellRun r = sh(cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
}

// 64 documents of 63 lowercase letters, one per line.
inline std::string write_docs(const std::string& dir) {
  std::mt19937 g(5);
  const std::string path = dir + "/docs.txt";
  std::ofstream f(path);
  for (int d = 0; d < 64; ++d) {
    std::string s(63, 'a');
    for (char& c : s) c = static_cast<char>('a' + g() % 26);
    f << s << "\n";
  }
  return path;
}

inline std::string job(const std::string& docs, const std::string& dump, bool moe, int steps) {
  std::string a = std::string(TITAN_BINARY) + " train --training.mixed_precision_param float32" +
                  " --model.n_layers 2 --model.dim 32 --model.n_heads 4 --model.n_kv_heads 2" +
                  " --model.head_dim 16 --model.hidden_dim 64 --model.vocab_size 260" +
                  " --training.seq_len 32 --training.local_batch_size 2 --training.steps " +
                  std::to_string(steps) + " --metrics.log_freq 1 --dataloader.dataset text" +
                  " --dataloader.dataset_path " + docs + " --dataloader.shuffle false" +
                  " --lr_scheduler.warmup_steps 2 --checkpoint.enable --checkpoint.interval 1000" +
                  " --dump_folder " + dump;
  if (moe)
    a += " --config qwen3_debugmodel_moe --model.num_experts 4 --model.top_k 2"
         " --model.moe_hidden_dim 16 --model.load_balance_coeff 0.001"
         " --model.router_aux_loss --model.router_aux_loss_coef 0.01";
  else
    a += " --config qwen3_debugmodel";
  return a;
}

// A job that starts from a Hugging Face fixture (tests/fixtures/hf/NAME) in fp32.
inline std::string hf_job(const std::string& fixture, const std::string& docs,
                          const std::string& dump, int steps) {
  return std::string(TITAN_BINARY) + " train --config qwen3_debugmodel --model.hf_assets_path " +
         TITAN_SOURCE_DIR + "/tests/fixtures/hf/" + fixture +
         " --checkpoint.initial_load_in_hf --training.mixed_precision_param float32"
         " --training.seq_len 32 --training.local_batch_size 2 --training.steps " +
         std::to_string(steps) +
         " --metrics.log_freq 1 --dataloader.dataset text --dataloader.dataset_path " + docs +
         " --dataloader.shuffle false --lr_scheduler.warmup_steps 2 --checkpoint.enable"
         " --checkpoint.interval 1000 --dump_folder " +
         dump;
}

inline std::vector<nlohmann::json> metrics(const std::string& dump) {
  std::vector<nlohmann::json> rows;
  std::ifstream f(dump + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// Losses and gradient norms within 1e-5 relative; final parameters within param_tol of each
// tensor's largest |value|.
inline void expect_same_training(const std::string& ref, const std::string& got, int steps,
                                 double param_tol = 1e-5) {
  const auto a = metrics(ref), b = metrics(got);
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  ASSERT_EQ(b.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    for (const char* k : {"loss", "grad_norm", "aux_loss"}) {
      ASSERT_EQ(a[s].contains(k), b[s].contains(k)) << k;
      if (!a[s].contains(k)) continue;  // aux_loss: MoE only
      const double x = a[s][k], y = b[s][k];
      EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << k << " at step " << s + 1;
    }
    EXPECT_EQ(a[s]["n_tokens_seen"], b[s]["n_tokens_seen"]);
  }
  const std::string step = "/checkpoint/step-" + std::to_string(steps);
  auto pa = ckpt::SafetensorsSet::open(ref + step), pb = ckpt::SafetensorsSet::open(got + step);
  ASSERT_EQ(pa.names(), pb.names());
  double worst = 0;
  for (const auto& name : pa.names()) {
    const auto* t = pa.find(name);
    std::vector<float> x(static_cast<size_t>(t->numel())), y(x.size());
    pa.read_f32(name, t->shape, x.data());
    pb.read_f32(name, t->shape, y.data());
    double scale = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
    }
    EXPECT_LE(diff, param_tol * scale) << name;
    worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  std::printf("%s vs one process: final parameters max |Δ| / max |w| = %.3g\n", got.c_str(), worst);
}

}  // namespace titan::dist_test
