// Data parallelism under mpirun against one process: the same global batch and seed, fp32, so
// only the order of the gradient sums differs. Per-step losses and gradient norms within 1e-5
// relative, final parameters within 1e-5 of the largest |parameter| of each tensor.
//
// The data makes the global batch the same whatever the layout: every document is exactly one
// microbatch of input tokens (byte tokenizer: 2·32 − 1 bytes + BOS + EOS, shifted = 2 rows of 32),
// so with documents d0, d1, ... rank r of N reads d_r, d_{r+N}, ... (documents r, r+N, ...) and one
// process with N microbatches of accumulation reads d0..d_{N−1} in its first step: the same
// tokens, split differently.
//
// The MoE model has both load-balancing schemes on: torchtitan's expert bias (counts all-reduced
// over the batch) and Transformers' auxiliary loss (each microbatch's own, averaged over every
// microbatch of every rank, as one process averages its accumulated microbatches).
//
// Layouts: DDP 2, FSDP 2 (also over TCP, --mca btl tcp,self, as between machines), FSDP 4 and
// HSDP 2×2; for the MoE model also expert parallelism: FSDP 2 × EP 2, FSDP 4 × EP 2 and
// HSDP 2×2 × EP 2 (the experts' gradients then come from the ranks that own them, summed by
// FSDP's reduce-scatter like any other). Also: a parallel layout that does not match the ranks, and
// an error on one rank that must end the whole job (not leave the other rank waiting in a
// collective). Skipped where mpirun is absent (scripts/install-deps.sh installs OpenMPI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "dist/run_util.h"
#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/checkpoint/safetensors.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
using testing::fresh_temp_dir;
using namespace dist_test;  // NOLINT(google-build-using-namespace)

// One tensor of a titan sharded checkpoint, put together from its slices (checkpoint.index.json:
// [file, begin, end) of the flattened tensor).
std::vector<float> read_sharded(const std::string& step_dir, const std::string& name) {
  std::ifstream f(step_dir + "/checkpoint.index.json");
  const auto t = nlohmann::json::parse(f).at("tensors").at(name);
  int64_t n = 1;
  for (int64_t d : t.at("shape")) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  for (const auto& s : t.at("slices")) {
    const auto file = ckpt::SafetensorsFile::open(step_dir + "/" + s[0].get<std::string>());
    const ckpt::TensorView* v = file.find(name);
    EXPECT_TRUE(v && v->dtype == DType::F32) << name;
    if (!v) continue;
    std::memcpy(out.data() + s[1].get<int64_t>(), v->data, v->nbytes);
  }
  return out;
}

struct Layout {
  const char* name;
  int np;
  const char* flags;
  const char* mpirun_flags = "";
};

class DataParallel : public ::testing::TestWithParam<bool> {};

TEST_P(DataParallel, MatchesOneProcessOnTheSameGlobalBatch) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install-deps.sh installs it)";
  const bool moe = GetParam();
  const std::string dir = fresh_temp_dir(moe ? "dp_moe" : "dp_dense");
  const std::string docs = write_docs(dir);
  const int steps = 4;
  std::vector<Layout> layouts = {
      {"ddp2", 2,
       "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1"},
      {"fsdp2", 2, ""},  // data_parallel_shard_degree -1: the two ranks
      // The same over TCP, as between machines (no shared-memory transport).
      {"fsdp2_tcp", 2, "", "--mca btl tcp,self"},
      {"fsdp4", 4, ""},
      {"hsdp2x2", 4,
       "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2"},
  };
  if (moe) {  // expert parallelism: the 4 experts split over 2 ranks of the shard group
    layouts.push_back({"fsdp2_ep2", 2, "--parallelism.expert_parallel_degree 2"});
    layouts.push_back({"fsdp4_ep2", 4, "--parallelism.expert_parallel_degree 2"});
    layouts.push_back({"hsdp2x2_ep2", 4,
                       "--parallelism.data_parallel_replicate_degree 2 "
                       "--parallelism.data_parallel_shard_degree 2 "
                       "--parallelism.expert_parallel_degree 2"});
  }
  for (int np : {2, 4}) {  // one process with np microbatches of accumulation
    const std::string ref = dir + "/one_" + std::to_string(np);
    const ShellRun r =
        sh(job(docs, ref, moe, steps) + " --training.global_batch_size " + std::to_string(2 * np));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    const std::string dump = dir + "/" + l.name;
    const ShellRun r =
        sh(mpirun(l.np, l.mpirun_flags) + job(docs, dump, moe, steps) + " " + l.flags);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("Data parallelism: "), std::string::npos) << r.out;
    // The communicator's count of the bytes sent against the layout's theoretical volume.
    const size_t at = r.out.find("(ratio ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_NEAR(std::stod(r.out.substr(at + 7)), 1.0, 0.05) << r.out.substr(at - 150, 170);
    if (std::strstr(l.flags, "expert_parallel")) {
      EXPECT_NE(r.out.find("Expert parallelism per step and rank: "), std::string::npos) << r.out;
    }
    expect_same_training(dir + "/one_" + std::to_string(l.np), dump, steps);
  }
}

// FSDP's parameter sharding under each fsdp_reshard_after_forward policy, with gradient
// accumulation (2 microbatches per rank, each unit's gradient reduce-scattered per microbatch):
// "never", "always" and "default" gather the same values, so they train bitwise alike, and like
// one process accumulating the same 4 microbatches within 1e-5. The tied dense model keeps its
// embedding in the head's group; the MoE model is untied.
TEST_P(DataParallel, ReshardPoliciesTrainAlikeWithAccumulation) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const bool moe = GetParam();
  const std::string dir = fresh_temp_dir(moe ? "dp_reshard_moe" : "dp_reshard_dense");
  const std::string docs = write_docs(dir);
  const int steps = 3;
  const std::string batch = " --training.global_batch_size 8";
  const ShellRun one = sh(job(docs, dir + "/one", moe, steps) + batch);
  ASSERT_EQ(one.code, 0) << one.out;
  std::vector<std::string> runs;
  for (const char* policy : {"default", "always", "never"}) {
    SCOPED_TRACE(policy);
    const std::string dump = dir + "/" + policy;
    const ShellRun r = sh(mpirun(2) + job(docs, dump, moe, steps) + batch +
                          " --parallelism.fsdp_reshard_after_forward " + policy);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("parameters gathered unit by unit"), std::string::npos) << r.out;
    const size_t at = r.out.find("(ratio ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_NEAR(std::stod(r.out.substr(at + 7)), 1.0, 0.05) << r.out.substr(at - 150, 170);
    expect_same_training(dir + "/one", dump, steps);
    runs.push_back(dump);
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    const auto a = metrics(runs[0]), b = metrics(runs[i]);
    ASSERT_EQ(a.size(), b.size());
    for (size_t s = 0; s < a.size(); ++s)
      EXPECT_EQ(a[s]["loss"].get<double>(), b[s]["loss"].get<double>()) << runs[i];
    const std::string step = "/checkpoint/step-" + std::to_string(steps) + "/model.safetensors";
    std::ifstream fa(runs[0] + step, std::ios::binary), fb(runs[i] + step, std::ios::binary);
    const std::string ba((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
    const std::string bb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(!ba.empty() && ba == bb) << runs[i] << ": final weights differ from default's";
  }
}

// bf16 mixed precision: FSDP gathers the parameters in bf16 (half the bytes: the communicator's
// count matches the theory with 2-byte gathers), so the model computes with bf16-rounded norm
// weights (and untied embedding rows) where one process reads their fp32 masters: a difference
// of at most 2^-9 relative in those weights, against bf16 GEMMs that round every operand anyway.
// Measured over 6 steps: losses within 4.3e-5 relative (dense; MoE 2.5e-5), gradient norms
// 1.1e-3; bounds 5e-4 and 5e-3.
TEST_P(DataParallel, Bf16GathersTrainLikeOneProcessInBf16) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const bool moe = GetParam();
  const std::string dir = fresh_temp_dir(moe ? "dp_bf16_moe" : "dp_bf16_dense");
  const std::string docs = write_docs(dir);
  const int steps = 6;
  auto bf16 = [&](const std::string& dump) {
    std::string a = job(docs, dump, moe, steps);
    const std::string f32 = "mixed_precision_param float32";
    return a.replace(a.find(f32), f32.size(), "mixed_precision_param bfloat16");
  };
  const ShellRun one = sh(bf16(dir + "/one") + " --training.global_batch_size 4");
  ASSERT_EQ(one.code, 0) << one.out;
  const ShellRun r =
      sh(mpirun(2) + bf16(dir + "/fsdp") + " --checkpoint.last_save_model_only false");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t at = r.out.find("(ratio ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(at + 7)), 1.0, 0.05) << r.out.substr(at - 150, 170);
  const auto a = metrics(dir + "/one"), b = metrics(dir + "/fsdp");
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  ASSERT_EQ(b.size(), static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const double la = a[i]["loss"], lb = b[i]["loss"], ga = a[i]["grad_norm"],
                 gb = b[i]["grad_norm"];
    EXPECT_NEAR(lb, la, 5e-4 * la) << "step " << i + 1;
    EXPECT_NEAR(gb, ga, 5e-3 * ga) << "step " << i + 1;
  }
  // A model-only save (the default last save) gathers the fp32 masters exactly, not their bf16
  // rounding: the same bits as the sharded checkpoint of the same run holds.
  const ShellRun whole = sh(mpirun(2) + bf16(dir + "/whole"));
  ASSERT_EQ(whole.code, 0) << whole.out;
  const std::string step = "/checkpoint/step-" + std::to_string(steps);
  auto model_only = ckpt::SafetensorsSet::open(dir + "/whole" + step);
  ASSERT_FALSE(model_only.names().empty());
  for (const auto& name : model_only.names()) {
    const auto* t = model_only.find(name);
    std::vector<float> y(static_cast<size_t>(t->numel()));
    model_only.read_f32(name, t->shape, y.data());
    EXPECT_EQ(read_sharded(dir + "/fsdp" + step, name), y) << name;
  }
}

// Hugging Face initial weights under FSDP: each rank reads only its slices from the mapped files
// (models/qwen3/state_dict_adapter: the fused expert layout split across ranks too), and trains
// like one process that read them whole.
TEST(DataParallelHf, FsdpReadsItsSlicesOfHuggingFaceWeightsAndTrainsLikeOneProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_hf");
  const std::string docs = write_docs(dir);
  const int steps = 3;
  for (const char* fixture : {"moe_norm_fused", "tied_gqa2"}) {
    SCOPED_TRACE(fixture);
    auto run_job = [&](const std::string& dump) { return hf_job(fixture, docs, dump, steps); };
    const std::string one = dir + "/one_" + fixture, fsdp = dir + "/fsdp_" + fixture;
    const ShellRun a = sh(run_job(one) + " --training.global_batch_size 4");
    ASSERT_EQ(a.code, 0) << a.out;
    const ShellRun b = sh(mpirun(2) + run_job(fsdp));
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_NE(b.out.find("(this rank's slices)"), std::string::npos) << b.out;
    expect_same_training(one, fsdp, steps);
  }
}

// The last save as a Hugging Face export under FSDP is written by the ranks in parallel: one file
// per rank (each unit's tensors whole, from the unit gathered in turn) and the index; it holds
// the same keys as one process's export and the same values within the training tolerance, and
// the checksums cover every file.
TEST(DataParallelHf, FsdpWritesTheHuggingFaceExportInParallel) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_hf_export");
  const std::string docs = write_docs(dir);
  const int steps = 2;
  auto job = [&](const std::string& dump) {
    return std::string(TITAN_BINARY) + " train --config qwen3_debugmodel --model.hf_assets_path " +
           TITAN_SOURCE_DIR +
           "/tests/fixtures/hf/moe_norm_fused --checkpoint.initial_load_in_hf"
           " --training.mixed_precision_param float32 --training.seq_len 32"
           " --training.local_batch_size 2 --training.steps " +
           std::to_string(steps) + " --dataloader.dataset text --dataloader.dataset_path " + docs +
           " --dataloader.shuffle false --checkpoint.enable --checkpoint.interval 1000"
           " --checkpoint.last_save_in_hf --dump_folder " +
           dump;
  };
  const ShellRun a = sh(job(dir + "/one") + " --training.global_batch_size 8");
  ASSERT_EQ(a.code, 0) << a.out;
  const ShellRun b = sh(mpirun(4) + job(dir + "/fsdp"));
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("4 files written in parallel"), std::string::npos) << b.out;
  const std::string step = "/checkpoint/step-" + std::to_string(steps);
  for (const char* f :
       {"model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors",
        "model.safetensors.index.json", "config.json", "generation_config.json", "checksums.json"})
    EXPECT_TRUE(fs::exists(dir + "/fsdp" + step + "/" + f)) << f;
  std::ifstream sums(dir + "/fsdp" + step + "/checksums.json");
  const auto files = nlohmann::json::parse(sums).at("files");
  for (const auto& e : fs::directory_iterator(dir + "/fsdp" + step)) {
    if (e.path().filename() != "checksums.json") {
      EXPECT_TRUE(files.contains(e.path().filename().string())) << e.path();
    }
  }
  auto x = ckpt::SafetensorsSet::open(dir + "/one" + step);
  auto y = ckpt::SafetensorsSet::open(dir + "/fsdp" + step);
  ASSERT_EQ(x.names(), y.names());
  for (const auto& name : x.names()) {
    const auto* t = x.find(name);
    std::vector<float> u(static_cast<size_t>(t->numel())), v(u.size());
    x.read_f32(name, t->shape, u.data());
    y.read_f32(name, t->shape, v.data());
    for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(v[i], u[i], 1e-5) << name << "[" << i << "]";
  }
  // Transformers loads it with an empty report (where the tools venv exists).
  const std::string py = std::string(TITAN_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py))
    GTEST_SKIP() << "no Python environment (tools/setup_venv.sh): skipped the transformers check";
  const ShellRun check =
      sh(py + " " + TITAN_SOURCE_DIR + "/tools/check_hf_export.py " + dir + "/fsdp" + step);
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("\"ok\": true"), std::string::npos) << check.out;
}

INSTANTIATE_TEST_SUITE_P(Models, DataParallel, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Moe") : std::string("Dense");
                         });

// Checkpoints of a sharded run (FSDP) are written by every rank in parallel (a shard file each
// plus an index), those of DDP by rank 0; either loads into any layout. Resuming in the same
// layout continues bitwise as if uninterrupted; another layout (and one process) loads the same
// weights and optimizer state and trains on (keeping the data positions when it has as many data
// ranks, else restarting the data order with a warning).
TEST(DataParallelCheckpoint, ResumesInTheSameLayoutBitwiseAndLoadsInAnother) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_resume");
  const std::string docs = write_docs(dir);
  const std::string full = dir + "/full", part = dir + "/part";
  ShellRun r = sh(mpirun(2) + job(docs, full, false, 4));
  ASSERT_EQ(r.code, 0) << r.out;
  // A run of 2 steps (a full checkpoint at step 2), then resumed to step 4 in the same layout.
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  r = sh(mpirun(2) + job(docs, part, false, 2) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(part + "/checkpoint/step-2/checkpoint.index.json"));
  EXPECT_TRUE(fs::exists(part + "/checkpoint/step-2/shard-00001-of-00002.safetensors"));
  r = sh(mpirun(2) + job(docs, part, false, 4) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step:  3"), std::string::npos) << r.out;
  const auto a = metrics(full), b = metrics(part);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_EQ(a[s]["loss"].get<double>(), b[s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(a[s]["grad_norm"].get<double>(), b[s]["grad_norm"].get<double>());
  }
  // The 2-rank checkpoint of step 2 loads into one process (the same global batch, accumulated)
  // and into DDP 2, and both go on with the data the 2-rank run trained at step 3: the data
  // position is one for the whole layout.
  for (const std::string& launcher : {std::string(), mpirun(2)}) {
    const std::string other = dir + (launcher.empty() ? "/one" : "/ddp");
    fs::create_directories(other + "/checkpoint");
    fs::copy(part + "/checkpoint/step-2", other + "/checkpoint/step-2",
             fs::copy_options::recursive);
    r = sh(launcher + job(docs, other, false, 3) +
           (launcher.empty() ? " --training.global_batch_size 4"
                             : " --parallelism.data_parallel_replicate_degree 2"
                               " --parallelism.data_parallel_shard_degree 1"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find("the data order restarts"), std::string::npos) << r.out;
    const auto c = metrics(other);
    ASSERT_EQ(c.size(), 1u);  // step 3 only
    const double x = a[2]["loss"], y = c[0]["loss"];
    EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << other;
  }
}

// Resharding on load: FSDP 4 saves step 2 (four shard files written in parallel); HSDP 2×2,
// FSDP 2 and one process (the same global batch of 8; accumulated over 2 and 4 microbatches)
// continue it like FSDP 4 itself: the same data position, the same rows at steps 3 and 4.
// Losses and gradient norms within 1e-5 relative (only the reduction order differs).
TEST(DataParallelCheckpoint, ShardedSaveOfFourRanksLoadsIntoOtherLayouts) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_reshard");
  const std::string docs = write_docs(dir);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  const std::string full = dir + "/fsdp4_full", part = dir + "/fsdp4_part";
  ShellRun r = sh(mpirun(4) + job(docs, full, false, 4) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(4) + job(docs, part, false, 2) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(part + "/checkpoint/step-2/shard-00003-of-00004.safetensors")) << r.out;
  auto resume = [&](const std::string& name, const std::string& launcher,
                    const std::string& flags) {
    const std::string other = dir + "/" + name;
    fs::create_directories(other + "/checkpoint");
    fs::copy(part + "/checkpoint/step-2", other + "/checkpoint/step-2",
             fs::copy_options::recursive);
    const ShellRun run = sh(launcher + job(docs, other, false, 4) + keep + flags);
    EXPECT_EQ(run.code, 0) << run.out;
    EXPECT_NE(run.out.find("Resuming from sharded checkpoint"), std::string::npos) << run.out;
    return other;
  };
  auto same_steps = [](const std::vector<nlohmann::json>& a, size_t from,
                       const std::vector<nlohmann::json>& b) {
    ASSERT_EQ(b.size(), 2u);  // steps 3 and 4
    for (size_t s = 0; s < 2; ++s)
      for (const char* k : {"loss", "grad_norm"}) {
        const double x = a[from + s][k], y = b[s][k];
        EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << k << " at step " << s + 3;
      }
  };
  const std::string hsdp = resume("hsdp", mpirun(4),
                                  " --parallelism.data_parallel_replicate_degree 2"
                                  " --parallelism.data_parallel_shard_degree 2");
  same_steps(metrics(full), 2, metrics(hsdp));
  const std::string fsdp2 = resume("fsdp2", mpirun(2), " --training.global_batch_size 8");
  same_steps(metrics(full), 2, metrics(fsdp2));
  const std::string one = resume("one", "", " --training.global_batch_size 8");
  same_steps(metrics(full), 2, metrics(one));
  // By ids: the data position each saved at step 4 (the pending token ids and the cursor into
  // the document order) is the uninterrupted FSDP 4 run's.
  const auto position = [](const std::string& dump) {
    std::ifstream f(dump + "/checkpoint/step-4/train_state.json");
    return nlohmann::json::parse(f)["dataloader"];
  };
  for (const std::string& d : {hsdp, fsdp2, one}) EXPECT_EQ(position(d), position(full)) << d;
}

// The same global batch in every layout on a real corpus (wikitext-2 with the Qwen3 tokenizer,
// documents packed across rows): one process accumulating 4 microbatches, DDP 2, FSDP 2, HSDP
// 2×2 and FSDP 2 × TP 2 train on the same tokens, losses within 1e-5 relative in fp32.
TEST(DataParallelData, EveryLayoutTrainsOnTheSameTokens) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_same_tokens");
  const int steps = 3;
  const std::string data = " --dataloader.dataset_path " +
                           titan::testing::asset("datasets/wikitext-2/valid.txt") +
                           " --dataloader.tokenizer " + titan::testing::asset("tokenizers/qwen3") +
                           " --model.vocab_size 151936 --training.local_batch_size 1"
                           " --training.global_batch_size 4 --training.seq_len 64";
  ShellRun r = sh(job("unused", dir + "/one", false, steps) + data);
  ASSERT_EQ(r.code, 0) << r.out;
  struct Layout {
    const char* name;
    int np;
    const char* flags;
  };
  for (const Layout& l : {Layout{"ddp2", 2,
                                 " --parallelism.data_parallel_replicate_degree 2"
                                 " --parallelism.data_parallel_shard_degree 1"},
                          Layout{"fsdp2", 2, ""},
                          Layout{"hsdp2x2", 4,
                                 " --parallelism.data_parallel_replicate_degree 2"
                                 " --parallelism.data_parallel_shard_degree 2"},
                          Layout{"fsdp2_tp2", 4,
                                 " --parallelism.data_parallel_shard_degree 2"
                                 " --parallelism.tensor_parallel_degree 2"}}) {
    r = sh(mpirun(l.np) + job("unused", dir + "/" + l.name, false, steps) + data + l.flags);
    ASSERT_EQ(r.code, 0) << l.name << "\n" << r.out;
    const auto a = metrics(dir + "/one"), b = metrics(dir + "/" + l.name);
    ASSERT_EQ(a.size(), static_cast<size_t>(steps));
    ASSERT_EQ(b.size(), static_cast<size_t>(steps)) << l.name;
    for (int s = 0; s < steps; ++s) {
      const double x = a[s]["loss"], y = b[s]["loss"];
      EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << l.name << " step " << s + 1;
      EXPECT_EQ(a[s]["n_tokens_seen"], b[s]["n_tokens_seen"]) << l.name;
    }
  }
}

// A rank killed with SIGKILL in the middle of writing its shard of step 4: mpirun ends the job
// (non-zero exit, no hang), step-4 was never committed, and the same command resumes from step 2
// (removing the dead job's temporary folder) and continues bitwise as the uninterrupted run.
TEST(DataParallelCheckpoint, RankKilledWhileSavingResumesFromTheLastCommittedStep) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_sigkill");
  const std::string docs = write_docs(dir);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  const std::string full = dir + "/full", killed = dir + "/killed";
  ShellRun r = sh(mpirun(2) + job(docs, full, false, 6) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string cmd = job(docs, killed, false, 6) + keep;
  r = sh("timeout 120 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 1 " +
         cmd + " : -np 1 env TITAN_TEST_KILL_AT=save:shard@2 " + cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung until the timeout:\n" << r.out;
  EXPECT_TRUE(fs::exists(killed + "/checkpoint/step-2/checkpoint.index.json"));
  EXPECT_FALSE(fs::exists(killed + "/checkpoint/step-4"));
  r = sh(mpirun(2) + cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Removed 1 unfinished folder"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at step 2"), std::string::npos) << r.out;
  const auto a = metrics(full), b = metrics(killed);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t s = 0; s < 6; ++s)
    EXPECT_EQ(a[s]["loss"].get<double>(), b[s]["loss"].get<double>()) << "step " << s + 1;
}

// A checkpoint of one process (whole tensors) resumed by FSDP 2 (read unit by unit, each rank
// keeping its blocks and its slices of the moments) trains on like DDP 2 resuming it (whole
// weights and moments on each rank): the same data order (both restart it), within 1e-5.
TEST(DataParallelCheckpoint, OneProcessCheckpointLoadsUnitByUnitIntoFsdp) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_unit_load");
  const std::string docs = write_docs(dir);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  ShellRun r = sh(job(docs, dir + "/one", false, 2) + keep + " --training.global_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(dir + "/one/checkpoint/step-2/optimizer.safetensors"));
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* flags : {"",
                            " --parallelism.data_parallel_replicate_degree 2"
                            " --parallelism.data_parallel_shard_degree 1"}) {
    const std::string other = dir + (*flags ? "/ddp2" : "/fsdp2");
    fs::create_directories(other + "/checkpoint");
    fs::copy(dir + "/one/checkpoint/step-2", other + "/checkpoint/step-2",
             fs::copy_options::recursive);
    r = sh(mpirun(2) + job(docs, other, false, 4) + keep + flags);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("Resuming from checkpoint"), std::string::npos) << r.out;
    runs.push_back(metrics(other));
  }
  ASSERT_EQ(runs[0].size(), 2u);
  ASSERT_EQ(runs[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s)
    for (const char* k : {"loss", "grad_norm"}) {
      const double x = runs[1][s][k], y = runs[0][s][k];
      EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << k << " at step " << s + 3;
    }
}

// Validation with data parallelism: each rank evaluates its own documents of the validation set
// (through the sharded parameters) and the sums are all-reduced: the loss and token count of the
// whole set equal one process's (which evaluates all 64 one-microbatch documents itself).
TEST(DataParallelValidation, ShardedValidationEqualsOneProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_validate");
  const std::string docs = write_docs(dir);
  const std::string v = " --validator.enable --validator.freq 2 --validator.dataset_path " + docs;
  ShellRun r = sh(job(docs, dir + "/one", false, 2) + v + " --training.global_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + job(docs, dir + "/fsdp2", false, 2) + v);
  ASSERT_EQ(r.code, 0) << r.out;
  auto validation = [](const std::string& dump) {
    std::vector<nlohmann::json> rows;
    for (const auto& j : metrics(dump))
      if (j.contains("validation_loss")) rows.push_back(j);
    return rows;
  };
  const auto a = validation(dir + "/one"), b = validation(dir + "/fsdp2");
  ASSERT_EQ(a.size(), 2u);  // steps 1 and 2
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a[i]["validation_tokens"], b[i]["validation_tokens"]);
    const double x = a[i]["validation_loss"], y = b[i]["validation_loss"];
    EXPECT_NEAR(y, x, 1e-5 * std::fabs(x)) << "validation at step " << a[i]["step"];
  }
}

// optimizer.early_step_in_backward under DDP (each unit's gradient all-reduced, then applied),
// FSDP (each rank's block of a unit updated once its reduce-scatter completes) and tensor
// parallelism (each rank its slices; the norm over the tp ranks): like one process taking the
// step at the end on the same global batch, without clipping (max_norm 1e9).
TEST(DataParallelEarlyStep, DdpFsdpAndTpUpdateInTheBackwardLikeOneProcess) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_early_step");
  const std::string docs = write_docs(dir);
  const int steps = 3;
  const std::string no_clip = " --training.max_norm 1e9";
  const std::string early = no_clip + " --optimizer.early_step_in_backward true";
  ShellRun r = sh(job(docs, dir + "/one_acc", false, steps) + no_clip +
                  " --training.global_batch_size 4");  // 2 microbatches, the step at the end
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + job(docs, dir + "/ddp2", false, steps) + early +
         " --parallelism.data_parallel_replicate_degree 2"
         " --parallelism.data_parallel_shard_degree 1");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_training(dir + "/one_acc", dir + "/ddp2", steps);
  r = sh(mpirun(2) + job(docs, dir + "/fsdp2", false, steps) + early);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_training(dir + "/one_acc", dir + "/fsdp2", steps);
  r = sh(job(docs, dir + "/one", false, steps) + no_clip);
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + job(docs, dir + "/tp2", false, steps) + early +
         " --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_training(dir + "/one", dir + "/tp2", steps);
}

// 8-bit AdamW moments (optimizer.state_dtype int8) with data parallelism. DDP holds the whole
// state on each rank, as one process does: the same training within 1e-5. FSDP's shards cut some
// parameters inside a 256-element block, where each rank's piece gets a scale of its own: close
// to one process (1e-3), not equal. A sharded checkpoint of FSDP 2 resumes bitwise.
TEST(DataParallel8bit, DdpLikeOneProcessFsdpCloseAndResumesBitwise) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_int8");
  const std::string docs = write_docs(dir);
  const int steps = 4;
  const std::string q8 = " --optimizer.state_dtype int8";
  ShellRun r = sh(job(docs, dir + "/one", false, steps) + q8 + " --training.global_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + job(docs, dir + "/ddp2", false, steps) + q8 +
         " --parallelism.data_parallel_replicate_degree 2"
         " --parallelism.data_parallel_shard_degree 1");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_training(dir + "/one", dir + "/ddp2", steps);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  r = sh(mpirun(2) + job(docs, dir + "/fsdp2", false, steps) + q8 + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto one = metrics(dir + "/one"), fsdp = metrics(dir + "/fsdp2");
  ASSERT_EQ(fsdp.size(), static_cast<size_t>(steps));
  for (size_t s = 0; s < one.size(); ++s) {
    const double x = one[s]["loss"], y = fsdp[s]["loss"];
    EXPECT_NEAR(y, x, 1e-3 * std::fabs(x)) << "step " << s + 1;
  }
  const std::string again = dir + "/fsdp2_resumed";
  fs::create_directories(again + "/checkpoint");
  fs::copy(dir + "/fsdp2/checkpoint/step-2", again + "/checkpoint/step-2",
           fs::copy_options::recursive);
  r = sh(mpirun(2) + job(docs, again, false, steps) + q8 + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Resuming from sharded checkpoint"), std::string::npos) << r.out;
  const auto resumed = metrics(again);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t s = 0; s < 2; ++s)
    EXPECT_EQ(resumed[s]["loss"].get<double>(), fsdp[s + 2]["loss"].get<double>()) << s + 3;
}

// training.dtype bfloat16 (bf16 master weights, stochastic rounding keyed by shard, the same on
// every DDP replica) under DDP 2, TP 2 and FSDP 2, against one process with bf16 masters on the
// same global batch. DDP 2 sums the same two microbatch gradients as one process accumulating
// them, and its replicas round with the same bits: the same losses, bitwise (a replica rounding
// with bits of its own would drift from the other). TP's partial sums and FSDP's reduce-scatter
// differ in order, so a rounding can land on the other bf16 neighbour: within 1e-3 relative
// (measured 4e-5), also with the step in the backward. FSDP's sharded checkpoint (its bf16
// blocks widened) resumes bitwise.
TEST(DataParallelPureBf16, DdpTpAndFsdpTrainLikeOneProcessFsdpResumesBitwise) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_pure_bf16");
  const std::string docs = write_docs(dir);
  const int steps = 4;
  auto pure = [&](const std::string& dump) {
    std::string a = job(docs, dump, false, steps);
    const std::string f32 = "mixed_precision_param float32";
    return a.replace(a.find(f32), f32.size(), "mixed_precision_param bfloat16") +
           " --training.dtype bfloat16";
  };
  auto close = [&](const std::string& ref, const std::string& got, double tol) {
    const auto a = metrics(ref), b = metrics(got);
    ASSERT_EQ(b.size(), static_cast<size_t>(steps)) << got;
    for (size_t s = 0; s < a.size(); ++s) {
      const double x = a[s]["loss"], y = b[s]["loss"];
      EXPECT_NEAR(y, x, tol * std::fabs(x)) << got << " step " << s + 1;
    }
  };
  ShellRun r = sh(pure(dir + "/one_acc") + " --training.global_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + pure(dir + "/ddp2") +
         " --parallelism.data_parallel_replicate_degree 2"
         " --parallelism.data_parallel_shard_degree 1");
  ASSERT_EQ(r.code, 0) << r.out;
  close(dir + "/one_acc", dir + "/ddp2", 0);
  r = sh(pure(dir + "/one"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + pure(dir + "/tp2") +
         " --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2");
  ASSERT_EQ(r.code, 0) << r.out;
  close(dir + "/one", dir + "/tp2", 1e-3);
  const std::string keep = " --checkpoint.interval 2 --checkpoint.last_save_model_only false";
  r = sh(mpirun(2) + pure(dir + "/fsdp2") + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  close(dir + "/one_acc", dir + "/fsdp2", 1e-3);
  const std::string again = dir + "/fsdp2_resumed";
  fs::create_directories(again + "/checkpoint");
  fs::copy(dir + "/fsdp2/checkpoint/step-2", again + "/checkpoint/step-2",
           fs::copy_options::recursive);
  r = sh(mpirun(2) + pure(again) + keep);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto full = metrics(dir + "/fsdp2"), resumed = metrics(again);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t s = 0; s < 2; ++s)
    EXPECT_EQ(resumed[s]["loss"].get<double>(), full[s + 2]["loss"].get<double>()) << s + 3;
  // Each block updated as its reduce-scatter completes (optimizer.early_step_in_backward, no
  // clipping) like one process's step at the end.
  const std::string no_clip = " --training.max_norm 1e9";
  r = sh(pure(dir + "/one_acc_no_clip") + no_clip + " --training.global_batch_size 4");
  ASSERT_EQ(r.code, 0) << r.out;
  r = sh(mpirun(2) + pure(dir + "/fsdp2_early") + no_clip +
         " --optimizer.early_step_in_backward true");
  ASSERT_EQ(r.code, 0) << r.out;
  close(dir + "/one_acc_no_clip", dir + "/fsdp2_early", 1e-3);
}

// Under mpirun each rank's stdout is a pseudo-terminal, though the job's output is a pipe or a
// file here: no colour codes unless FORCE_COLOR asks for them; NO_COLOR wins over both.
TEST(DataParallelLogs, NoColourUnderMpirunUnlessAsked) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_colour");
  const std::string docs = write_docs(dir);
  const auto run = [&](const std::string& name, const std::string& env) {
    const ShellRun r = sh(mpirun(2, env) + job(docs, dir + "/" + name, false, 1));
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out.find("\x1b[") != std::string::npos;
  };
  EXPECT_FALSE(run("plain", ""));
  EXPECT_TRUE(run("forced", "-x FORCE_COLOR=1"));
  EXPECT_FALSE(run("no_color", "-x FORCE_COLOR=1 -x NO_COLOR=1"));
}

TEST(DataParallelErrors, LayoutThatDoesNotMatchTheRanks) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_bad_layout");
  const ShellRun r = sh(mpirun(2) + job(write_docs(dir), dir + "/run", false, 1) +
                        " --parallelism.data_parallel_replicate_degree 3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("Invalid parallel dims: dp_replicate(3) * dp_shard(0)"), std::string::npos)
      << r.out;
}

TEST(DataParallelErrors, OneRanksErrorEndsTheJob) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  const std::string dir = fresh_temp_dir("dp_one_rank_fails");
  const std::string docs = write_docs(dir);
  // Rank 1 is given a dataset path that does not exist: it fails while rank 0 goes on into the
  // first collectives. The job must end (not hang) with rank 1's message and a non-zero exit.
  const std::string good = job(docs, dir + "/run", false, 3);
  std::string bad = good;
  bad.replace(bad.find(docs), docs.size(), dir + "/missing.txt");
  const ShellRun r =
      sh("timeout 120 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 "
         "-np 1 " +
         good + " : -np 1 " + bad);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung until the timeout:\n" << r.out;
  EXPECT_NE(r.out.find("(rank 1 of 2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace titan
