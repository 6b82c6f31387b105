// Tensor parallelism under mpirun against one process on the same global batch and seed, fp32:
// only the order of the sums differs (the row-parallel outputs and the loss's log-sum-exp added
// over ranks). 10 steps; per-step losses and gradient norms within 1e-5 relative, final
// parameters within 1e-5 of the largest |parameter| of each tensor (dist/run_util.h).
// The equivalence runs use AdamW eps 1e-6: with the default 1e-8, an element whose gradient is
// itself ~1e-8 (a near-cancelling sum) moves by up to lr·g/(|g| + eps), so the ~1e-7 relative
// noise of a reordered sum becomes a visible difference in the update (measured: 6.6e-5 of
// max |w| after one step of the untied lm_head at eps 1e-8, 3.2e-6 at 1e-6, 8.3e-7 at 1e-4; the
// gradients themselves agree within 1e-5). The resharding runs use it too.
//
// Layouts: TP 2 with sequence parallelism (the default) and without, tied (qwen3_debugmodel) and
// untied (the 8B flavor's shape, shrunk) embeddings, full and selective-op activation
// checkpointing, FSDP 2 × TP 2 and DDP 2 × TP 2 on 4 ranks; the tiny MoE model (expert bias and
// auxiliary loss on) under TP 2 with and without SP and FSDP 2 × TP 2, its experts' hidden units
// split and the router replicated; and with EP borrowing the tp ranks (EP 2 on TP 2 with and
// without SP and with full AC, FSDP 2 × TP 2 × EP 2 and × EP 4). Each run's bytes in the tp group's
// collectives are checked against the theoretical TP/SP volume (train/tensor_parallel.h) within
// 5%. Also: Hugging Face initial weights (tied and untied fixtures) read whole and sliced;
// checkpoints written sharded by every rank and resharded between TP/EP layouts, FSDP 2 and one
// process, and one missing a slice refused; and the layouts torchtitan refuses, one clear line on
// every rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dist/run_util.h"
#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/checkpoint/checksums.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
using namespace dist_test;  // NOLINT(google-build-using-namespace)
using testing::fresh_temp_dir;

const char* const kUntied = " --model.flavor 8B";  // the same widths below, lm_head its own
const char* const kEps = " --optimizer.eps 1e-6";  // see the top of the file
const char* const kEp2 = " --parallelism.expert_parallel_degree 2";

double ratio_after(const std::string& out, const std::string& key) {
  const size_t at = out.find(key);
  return at == std::string::npos ? -1.0 : std::stod(out.substr(at + key.size()));
}

struct TpLayout {
  const char* name;
  int np;
  int data_ranks;  // the one-process reference accumulates this many microbatches
  const char* flags;
  bool moe = false;  // the tiny MoE model (4 experts, top-2, expert bias and aux loss on)
};

TEST(TensorParallel, MatchesOneProcessOnTheSameGlobalBatch) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install-deps.sh installs it)";
  const std::string dir = fresh_temp_dir("tp_equiv");
  const std::string docs = write_docs(dir);
  const int steps = 10;
  const std::string tp2 = " --parallelism.tensor_parallel_degree 2";
  const std::string ddp2 =
      " --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1";
  const std::vector<TpLayout> layouts = {
      {"tp2_sp", 2, 1, ""},
      {"tp2_nosp", 2, 1, " --parallelism.enable_sequence_parallel false"},
      {"tp2_sp_untied", 2, 1, kUntied},
      {"tp2_nosp_untied", 2, 1, " --parallelism.enable_sequence_parallel false --model.flavor 8B"},
      {"tp2_full_ac", 2, 1, " --activation_checkpoint.mode full"},
      {"tp2_op_ac", 2, 1,
       " --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
      {"fsdp2_tp2", 4, 2, ""},
      {"ddp2_tp2", 4, 2, ddp2.c_str()},
      // MoE: the experts' hidden units split (w1/w3 on dim 1, w2 on dim 2), the router replicated
      {"moe_tp2_sp", 2, 1, "", true},
      {"moe_tp2_nosp", 2, 1, " --parallelism.enable_sequence_parallel false", true},
      {"moe_fsdp2_tp2", 4, 2, "", true},
      // MoE with EP borrowing the tp ranks: whole experts on their ep rank, each tp rank routing
      // its own rows (SP: its sequence shard; without SP: 1/2 of the replicated rows); EP 2 = the
      // tp group (FSDP 2 × TP 2 × EP 2: experts sharded over efsdp 2) or both (EP 4: efsdp 1).
      {"moe_tp2_ep2_sp", 2, 1, kEp2, true},
      {"moe_tp2_ep2_nosp", 2, 1,
       " --parallelism.expert_parallel_degree 2 --parallelism.enable_sequence_parallel false",
       true},
      {"moe_tp2_ep2_full_ac", 2, 1,
       " --parallelism.expert_parallel_degree 2 --activation_checkpoint.mode full", true},
      {"moe_fsdp2_tp2_ep2", 4, 2, kEp2, true},
      {"moe_fsdp2_tp2_ep4", 4, 2, " --parallelism.expert_parallel_degree 4", true},
  };
  const std::string eps = kEps;
  auto ref_of = [&](int dp, bool untied, bool moe) {
    return dir + "/one_" + std::to_string(dp) + (untied ? "_untied" : "") + (moe ? "_moe" : "");
  };
  for (const int kind : {0, 1, 2})  // tied dense, untied dense, MoE
    for (int dp : {1, 2}) {
      const bool untied = kind == 1, moe = kind == 2;
      const ShellRun r =
          sh(job(docs, ref_of(dp, untied, moe), moe, steps) + eps + (untied ? kUntied : "") +
             " --training.global_batch_size " + std::to_string(2 * dp));
      ASSERT_EQ(r.code, 0) << r.out;
    }
  for (const TpLayout& l : layouts) {
    SCOPED_TRACE(l.name);
    const std::string dump = dir + "/" + l.name;
    const ShellRun r = sh(mpirun(l.np) + job(docs, dump, l.moe, steps) + eps + tp2 + l.flags);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("Tensor parallelism: TP 2"), std::string::npos) << r.out;
    EXPECT_NEAR(ratio_after(r.out, "(tp ratio "), 1.0, 0.05) << r.out;
    if (l.data_ranks > 1) {
      EXPECT_NEAR(ratio_after(r.out, "(ratio "), 1.0, 0.05) << r.out;
    }
    const bool untied = std::string(l.flags).find("8B") != std::string::npos;
    expect_same_training(ref_of(l.data_ranks, untied, l.moe), dump, steps);
  }
}

// Hugging Face weights under TP/EP: each rank reads only its slices of the mapped files (tied
// embedding and untied lm_head fixtures; MoE with per-expert tensors under TP 2 × EP 2, the
// experts split whole over the ranks, and with the fused gate_up_proj/down_proj under TP 2, their
// hidden units split) and trains like one process that read them whole.
TEST(TensorParallelHf, ReadsItsSlicesOfHuggingFaceWeightsAndTrainsLikeOneProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("tp_hf");
  const std::string docs = write_docs(dir);
  const int steps = 3;
  const std::string tp2 = " --parallelism.tensor_parallel_degree 2";
  for (const auto& [fixture, flags] : {std::pair<std::string, std::string>{"tied_gqa2", tp2},
                                       {"untied_gqa1", tp2},
                                       {"moe_norm", tp2 + kEp2},
                                       {"moe_norm_fused", tp2}}) {
    SCOPED_TRACE(fixture);
    auto run_job = [&](const std::string& dump) { return hf_job(fixture, docs, dump, steps); };
    const std::string one = dir + "/one_" + fixture, tp = dir + "/tp_" + fixture;
    const ShellRun a = sh(run_job(one));
    ASSERT_EQ(a.code, 0) << a.out;
    const ShellRun b = sh(mpirun(2) + run_job(tp) + flags);
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_NE(b.out.find("(this rank's slices)"), std::string::npos) << b.out;
    expect_same_training(one, tp, steps);
  }
}

// Checkpoints of a TP layout are sharded (each rank writes its slices in parallel,
// checkpoint.index.json version 2), and reshard on load: TP 2 → one process, one process → TP 2
// (sequence parallelism off), FSDP 2 × TP 2 → FSDP 2, FSDP 2 (sharded files) → FSDP 2 × TP 2.
// So do those of expert parallelism, whose ranks hold only their experts (sharded over the efsdp
// ranks): MoE FSDP 2 × EP 2 → FSDP 2, FSDP 2 → FSDP 2 × EP 2, FSDP 4 × EP 2 (efsdp 2) → FSDP 4,
// FSDP 2 × TP 2 × EP 2 → FSDP 2, FSDP 2 → FSDP 2 × TP 2 × EP 4, and FSDP 2 × TP 2 × EP 2 →
// FSDP 2 × TP 2 (the experts' EP slices read as TP slices of their hidden units).
// Each chain saves its full state at step 2 and resumes to step 4 in the other layout; the 4
// steps must match the uninterrupted one-process run of the same global batch. Then a TP
// checkpoint whose index misses a slice: one line naming the tensor, exit 1 on every rank.
TEST(TensorParallelCheckpoint, ReshardsBetweenLayouts) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("tp_reshard");
  const std::string docs = write_docs(dir);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  const std::string tp2 = " --parallelism.tensor_parallel_degree 2";
  const std::string ep2 = " --parallelism.expert_parallel_degree 2";
  auto ref = [&](int dp, bool moe) {
    return dir + (moe ? "/one_moe_" : "/one_") + std::to_string(dp);
  };
  for (const auto& [dp, moe] : {std::pair{1, false}, {2, false}, {2, true}, {4, true}}) {
    const ShellRun r = sh(job(docs, ref(dp, moe), moe, 4) + kEps +
                          " --training.global_batch_size " + std::to_string(2 * dp));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  struct Chain {
    const char* name;
    int dp;
    std::string first, second;  // launcher + flags of steps 1–2 and 3–4
    bool moe = false;
  };
  const std::string one_proc = " --training.global_batch_size 2";
  const std::vector<Chain> chains = {
      {"tp2_to_one", 1, mpirun(2) + "@" + tp2, "@" + one_proc},
      {"one_to_tp2", 1, "@" + one_proc,
       mpirun(2) + "@" + tp2 + " --parallelism.enable_sequence_parallel false"},
      {"fsdp2tp2_to_fsdp2", 2, mpirun(4) + "@" + tp2, mpirun(2) + "@"},
      {"fsdp2_to_fsdp2tp2", 2, mpirun(2) + "@", mpirun(4) + "@" + tp2},
      {"fsdp2ep2_to_fsdp2", 2, mpirun(2) + "@" + ep2, mpirun(2) + "@", true},
      {"fsdp2_to_fsdp2ep2", 2, mpirun(2) + "@", mpirun(2) + "@" + ep2, true},
      {"fsdp4ep2_to_fsdp4", 4, mpirun(4) + "@" + ep2, mpirun(4) + "@", true},
      {"fsdp2tp2ep2_to_fsdp2", 2, mpirun(4) + "@" + tp2 + ep2, mpirun(2) + "@", true},
      {"fsdp2_to_fsdp2tp2ep4", 2, mpirun(2) + "@",
       mpirun(4) + "@" + tp2 + " --parallelism.expert_parallel_degree 4", true},
      {"fsdp2tp2ep2_to_fsdp2tp2", 2, mpirun(4) + "@" + tp2 + ep2, mpirun(4) + "@" + tp2, true},
  };
  for (const Chain& c : chains) {
    SCOPED_TRACE(c.name);
    const std::string dump = dir + "/" + c.name;
    auto run = [&](const std::string& spec, int steps, const std::string& save) {
      const size_t at = spec.find('@');
      return sh(spec.substr(0, at) + job(docs, dump, c.moe, steps) + kEps + save +
                spec.substr(at + 1));
    };
    ShellRun r = run(c.first, 2, keep);
    ASSERT_EQ(r.code, 0) << r.out;
    if (c.first.find("--parallelism.") != std::string::npos) {  // written by every rank
      std::ifstream idx(dump + "/checkpoint/step-2/checkpoint.index.json");
      ASSERT_TRUE(idx.good()) << r.out;
      EXPECT_EQ(nlohmann::json::parse(idx).at("shards"),
                c.first.find("-np 4 ") != std::string::npos ? 4 : 2)
          << c.name;
    }
    r = run(c.second, 4, "");  // the last save: the model only, whole
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("step:  3"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("the data order restarts"), std::string::npos) << r.out;
    expect_same_training(ref(c.dp, c.moe), dump, 4);
  }
  // TP 2's step 2 with one run of a row-wise slice dropped from its index (checksums rewritten).
  const std::string step2 = dir + "/tp2_to_one/checkpoint/step-2";
  nlohmann::json idx = nlohmann::json::parse(std::ifstream(step2 + "/checkpoint.index.json"));
  const std::string victim = "layers.1.feed_forward.w2.weight";
  auto& slices = idx.at("tensors").at(victim).at("slices");
  ASSERT_EQ(slices.size(), 2u) << slices.dump();
  slices.erase(1);
  std::ofstream(step2 + "/checkpoint.index.json") << idx.dump();
  ckpt::write_checksums(step2);
  const ShellRun bad = sh(mpirun(2) + job(docs, dir + "/tp2_to_one", false, 4) + kEps + tp2 +
                          " --checkpoint.load_step 2");
  EXPECT_NE(bad.code, 0) << bad.out;
  EXPECT_NE(bad.code, 124) << "the job hung:\n" << bad.out;
  EXPECT_NE(bad.out.find(victim + "': its slices leave a gap or overlap at element"),
            std::string::npos)
      << bad.out;
}

// Layouts torchtitan refuses, and what titan does not implement under TP yet: one line naming the
// field, a non-zero exit on every rank, no hang.
TEST(TensorParallelErrors, RefusedLayoutsSayWhy) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("tp_bad");
  const std::string docs = write_docs(dir);
  const struct {
    int np;
    std::string flags, message;
  } cases[] = {
      {4, " --parallelism.tensor_parallel_degree 4 --model.n_kv_heads 2",
       "n_kv_heads (2) must be divisible by tp_size (4)"},
      {2,
       " --parallelism.tensor_parallel_degree 2 --training.seq_len 31 --training.local_batch_size "
       "1",
       "sequence parallelism needs the tokens per microbatch (local_batch_size x seq_len = 31) "
       "divisible by tp_size (2)"},
      {2, " --parallelism.tensor_parallel_degree 2 --model.hidden_dim 63",
       "hidden_dim (63) must be divisible by tp_size (2)"},
      {2, " --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2",
       "Invalid parallel dims: dp_replicate(1) * dp_shard(2) * cp(1) * tp(2) * pp(1) != "
       "WORLD_SIZE(2)"},
  };
  for (const auto& c : cases)
    expect_refused(mpirun(c.np) + job(docs, dir + "/run", false, 1) + c.flags, c.message);
  // MoE: the experts' hidden units must divide (without EP); EP must divide the ranks of the
  // replica's [dp_shard, tp] grid it borrows; EP over the tp ranks splits each microbatch's
  // tokens.
  const std::vector<std::pair<std::string, std::string>> moe_cases = {
      {" --model.moe_hidden_dim 15", "moe_hidden_dim (15) must be divisible by tp_size (2)"},
      {" --parallelism.expert_parallel_degree 4",
       "dp_shard(1) * cp(1) * tp(2) must be divisible by ep(4)"},
      {" --parallelism.expert_parallel_degree 2 --parallelism.enable_sequence_parallel false "
       "--training.seq_len 31 --training.local_batch_size 1",
       "local_batch_size x seq_len (31) must be divisible by tp_size (2)"}};
  for (const auto& [flags, message] : moe_cases) {
    const ShellRun r = sh(mpirun(2) + job(docs, dir + "/moe", true, 1) +
                          " --parallelism.tensor_parallel_degree 2" + flags);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace titan
