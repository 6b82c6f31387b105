// Checkpoints: exact resume, Hugging Face export/import round trip, and (when the project's
// Python environment exists) loading the export in the real transformers.
#include "titan/checkpoint/checkpointer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "test_util.h"
#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/registry.h"
#include "titan/train/trainer.h"

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 30; ++i) d.push_back("checkpoint test document " + std::to_string(i * 7919));
  return d;
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("titan_ckpt_" + std::to_string(getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

config::JobConfig small(const std::string& dump) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.dump_folder = dump;
  c.training.local_batch_size = 2;
  c.training.seq_len = 32;
  c.training.steps = 4;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 3;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;
  return c;
}

TEST(Checkpointer, ResumeContinuesBitwiseIdentically) {
  const std::string dump = temp_dir("resume");
  std::vector<double> losses;
  {
    train::Trainer t(small(dump), docs());
    for (int i = 0; i < 4; ++i) {
      losses.push_back(t.step().loss);
      t.maybe_checkpoint();
    }
  }
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-2/train_state.json"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-4/optimizer.safetensors"));
  config::JobConfig c = small(dump);
  c.checkpoint.load_step = 2;
  train::Trainer resumed(c, docs());
  EXPECT_EQ(resumed.current_step(), 2);
  EXPECT_EQ(resumed.step().loss, losses[2]);
  EXPECT_EQ(resumed.step().loss, losses[3]);
  c.checkpoint.load_step = 3;
  EXPECT_THROW(train::Trainer(c, docs()), Error);
}

TEST(Checkpointer, KeepLatestKPurgesOlderSteps) {
  const std::string dump = temp_dir("purge");
  config::JobConfig c = small(dump);
  c.training.steps = 8;
  c.checkpoint.interval = 1;
  c.checkpoint.keep_latest_k = 2;
  train::Trainer t(c, docs());
  for (int i = 0; i < 5; ++i) {
    t.step();
    t.maybe_checkpoint();
  }
  EXPECT_FALSE(fs::exists(dump + "/checkpoint/step-3"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-4"));
  EXPECT_TRUE(fs::exists(dump + "/checkpoint/step-5"));
}

// The sharded layout (what FSDP ranks write in parallel), made here in one process: three
// "ranks" write their shards of uneven flat ranges, rank 0 commits; loading with other ranges
// (two ranks, one process) gives bitwise the same parameters and moments, and an index whose
// slices leave a gap is refused naming the tensor.
TEST(Checkpointer, ShardedSaveLoadsIntoOtherRanges) {
  const std::string dump = temp_dir("sharded");
  config::JobConfig c = small(dump);
  train::Trainer t(c, docs());
  t.step();
  models::Model& model = t.model();
  const int64_t n = model.num_params();
  std::vector<float> m(static_cast<size_t>(n)), v(m.size());
  for (int64_t i = 0; i < n; ++i) {
    m[static_cast<size_t>(i)] = 1e-3f * static_cast<float>(i % 977) - 0.3f;
    v[static_cast<size_t>(i)] = 1e-6f * static_cast<float>(i % 313);
  }
  // Rank 1 holds two segments split at a parameter's start (as an FSDP rank holds its block of
  // every unit).
  const int64_t c0 = n / 3 + 5, c1 = n / 3 - 7;
  int64_t mid = c0 + c1;
  for (const auto& p : model.params())
    if (p.offset > c0 && p.offset < mid) mid = p.offset;
  ASSERT_LT(mid, c0 + c1);
  const std::vector<Segments> shards{
      {{0, c0}}, {{c0, mid - c0}, {mid, c0 + c1 - mid}}, {{c0 + c1, n - c0 - c1}}};
  Checkpointer ck(c);
  TrainState st;
  st.step = 1;
  const std::string tmp = ck.sharded_begin(st.step);
  json written = json::array();
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t off = shards[static_cast<size_t>(r)][0].begin;
    written.push_back(ck.write_shard(tmp, r, 3, shards[static_cast<size_t>(r)], model, nullptr,
                                     {m.data() + off, v.data() + off}));
  }
  ck.sharded_commit(tmp, st, model, written);
  const std::string step = dump + "/checkpoint/step-1";
  ASSERT_TRUE(fs::exists(step + "/" + kShardedIndexName));
  ASSERT_TRUE(fs::exists(step + "/shard-00002-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(json::parse(std::ifstream(step + "/" + kShardedIndexName)).at("version"), 1);
  const std::vector<float> w(model.store().param_data(), model.store().param_data() + n);

  // Into two ranks' ranges and into one process, after scrambling everything.
  for (const std::vector<int64_t>& split :
       {std::vector<int64_t>{n / 2 + 1, n - n / 2 - 1}, std::vector<int64_t>{n}}) {
    int64_t begin = 0;
    for (int64_t len : split) {
      std::fill_n(model.store().param_data(), n, 7.0f);
      std::vector<float> m2(static_cast<size_t>(len), 9.0f), v2(m2.size(), 9.0f);
      const auto loaded = Checkpointer(c).load(model, {m2.data(), v2.data()}, {{begin, len}});
      ASSERT_TRUE(loaded.has_value());
      EXPECT_EQ(loaded->step, 1);
      EXPECT_EQ(std::memcmp(model.store().param_data(), w.data(), w.size() * 4), 0);
      EXPECT_EQ(std::memcmp(m2.data(), m.data() + begin, m2.size() * 4), 0);
      EXPECT_EQ(std::memcmp(v2.data(), v.data() + begin, v2.size() * 4), 0);
      begin += len;
    }
  }
  // A damaged index: one slice of one tensor dropped (checksums rewritten to match).
  json idx = json::parse(std::ifstream(step + "/" + kShardedIndexName));
  const std::string victim = model.params()[1].fqn;
  idx["tensors"][victim]["slices"].erase(0);
  std::ofstream(step + "/" + kShardedIndexName) << idx.dump();
  write_checksums(step);
  try {
    Checkpointer(c).load(model, {m.data(), v.data()});
    ADD_FAILURE() << "a gap in the slices loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(kShardedIndexName), std::string::npos) << e.what();
  }
  // bf16 moments (optimizer.state_dtype bfloat16): written as BF16 shards, read back bitwise into
  // other ranges.
  std::vector<uint16_t> mb(m.size()), vb(m.size());
  f32_to(DType::BF16, m.data(), n, mb.data());
  f32_to(DType::BF16, v.data(), n, vb.data());
  st.step = 2;
  const std::string tmp2 = ck.sharded_begin(st.step);
  written = json::array();
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t off = shards[static_cast<size_t>(r)][0].begin;
    written.push_back(ck.write_shard(tmp2, r, 3, shards[static_cast<size_t>(r)], model, nullptr,
                                     {DType::BF16, mb.data() + off, vb.data() + off}));
  }
  ck.sharded_commit(tmp2, st, model, written);
  const SafetensorsSet step2 =
      SafetensorsSet::open(dump + "/checkpoint/step-2/shard-00000-of-00003.safetensors");
  const TensorView* t2 = step2.find("exp_avg." + model.params()[0].fqn);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(t2->dtype, DType::BF16);
  const int64_t half = n / 2 + 1;
  std::vector<uint16_t> m3(static_cast<size_t>(n - half), 1), v3(m3.size(), 1);
  ASSERT_TRUE(Checkpointer(c)
                  .load(model, {DType::BF16, m3.data(), v3.data()}, {{half, n - half}})
                  .has_value());
  EXPECT_EQ(std::memcmp(m3.data(), mb.data() + half, m3.size() * 2), 0);
  EXPECT_EQ(std::memcmp(v3.data(), vb.data() + half, v3.size() * 2), 0);
}

// Tensor-parallel shards, as the four ranks of FSDP 2 × TP 2 write them in parallel, made here in
// one process: each "rank" holds its TP slice (a model built for it) and one FSDP range of it,
// cut inside a parameter; tp rank 1 leaves the replicated norms to tp rank 0. The index's
// strided entries (version 2) load bitwise into the whole model and into the slices of another
// layout (TP 2 without FSDP); an index missing one run of a row-wise slice is refused naming the
// tensor.
TEST(Checkpointer, TensorParallelShardsLoadIntoAnyLayout) {
  const std::string dump = temp_dir("tp_sharded");
  config::JobConfig c = small(dump);
  models::BuildOptions o;
  o.batch = 2;
  o.seq_len = 32;
  o.seed = 5;
  o.log_overrides = false;
  const auto whole = models::build_model(c, o);
  const int64_t n = whole->num_params();
  std::vector<float> m(static_cast<size_t>(n)), v(m.size());
  for (int64_t i = 0; i < n; ++i) {
    m[static_cast<size_t>(i)] = 1e-3f * static_cast<float>(i % 977) - 0.3f;
    v[static_cast<size_t>(i)] = 1e-6f * static_cast<float>(i % 313);
  }
  auto slice_model = [&](int tp_rank) {
    models::BuildOptions so = o;
    so.init = false;
    so.tp = {tp_rank, 2, true};
    auto s = models::build_model(c, so);
    parallel::TensorParallel::slice(*s, s->store().param_data(), *whole,
                                    whole->store().param_data());
    return s;
  };
  Checkpointer ck(c);
  TrainState st;
  st.step = 1;
  const std::string tmp = ck.sharded_begin(st.step);
  json written = json::array();
  for (int fsdp = 0; fsdp < 2; ++fsdp)
    for (int tp = 0; tp < 2; ++tp) {
      const auto local = slice_model(tp);
      const int64_t ln = local->num_params(), cut = ln / 2 + 3;
      std::vector<float> lm(static_cast<size_t>(ln)), lv(lm.size());
      parallel::TensorParallel::slice(*local, lm.data(), *whole, m.data());
      parallel::TensorParallel::slice(*local, lv.data(), *whole, v.data());
      const Segments segs{fsdp == 0 ? FlatRange{0, cut} : FlatRange{cut, ln - cut}};
      const int64_t at = segs[0].begin;
      written.push_back(ck.write_shard(tmp, 2 * fsdp + tp, 4, segs, *local, nullptr,
                                       {lm.data() + at, lv.data() + at}, tp == 0));
    }
  ck.sharded_commit(tmp, st, *whole, written);
  const std::string step = dump + "/checkpoint/step-1";
  const json idx = json::parse(std::ifstream(step + "/" + kShardedIndexName));
  EXPECT_EQ(idx.at("version"), 2);
  EXPECT_EQ(idx.at("shards"), 4);

  // The whole model, after scrambling it.
  const auto again = models::build_model(c, o);
  std::fill_n(again->store().param_data(), n, 7.0f);
  std::vector<float> m2(m.size(), 9.0f), v2(m.size(), 9.0f);
  ASSERT_TRUE(Checkpointer(c).load(*again, {m2.data(), v2.data()}).has_value());
  EXPECT_EQ(std::memcmp(again->store().param_data(), whole->store().param_data(),
                        static_cast<size_t>(n) * 4),
            0);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);
  // Each rank of TP 2 (the whole of its slice, no FSDP).
  for (int tp = 0; tp < 2; ++tp) {
    const auto want = slice_model(tp);
    models::BuildOptions so = o;
    so.init = false;
    so.tp = {tp, 2, false};
    const auto got = models::build_model(c, so);
    const int64_t ln = got->num_params();
    std::fill_n(got->store().param_data(), ln, 7.0f);
    std::vector<float> lm(static_cast<size_t>(ln), 9.0f), lv(lm.size(), 9.0f), wm(lm.size()),
        wv(lm.size());
    ASSERT_TRUE(Checkpointer(c).load(*got, {lm.data(), lv.data()}).has_value());
    parallel::TensorParallel::slice(*want, wm.data(), *whole, m.data());
    parallel::TensorParallel::slice(*want, wv.data(), *whole, v.data());
    EXPECT_EQ(std::memcmp(got->store().param_data(), want->store().param_data(),
                          static_cast<size_t>(ln) * 4),
              0);
    EXPECT_EQ(lm, wm);
    EXPECT_EQ(lv, wv);
  }
  // A row-wise slice's run group dropped (checksums rewritten to match).
  json bad = idx;
  const std::string victim = "layers.1.attention.wo.weight";
  auto& slices = bad["tensors"][victim]["slices"];
  ASSERT_TRUE(
      std::any_of(slices.begin(), slices.end(), [](const json& e) { return e.size() == 6; }));
  slices.erase(1);
  std::ofstream(step + "/" + kShardedIndexName) << bad.dump();
  write_checksums(step);
  try {
    Checkpointer(c).load(*again, {m2.data(), v2.data()});
    ADD_FAILURE() << "a missing slice loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim + "': its slices leave a gap"), std::string::npos)
        << e.what();
  }
  // A run count that would overflow (and expand to 10^15 runs) is refused before any expansion.
  slices[0][4] = int64_t{1000000000000000};
  std::ofstream(step + "/" + kShardedIndexName) << bad.dump();
  write_checksums(step);
  try {
    Checkpointer(c).load(*again, {m2.data(), v2.data()});
    ADD_FAILURE() << "an absurd run count loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lies outside its 2048 elements"), std::string::npos)
        << e.what();
  }
}

class HfRoundTrip : public ::testing::TestWithParam<std::string> {};

// Load a transformers-made model, train 3 steps, export in HF format; importing the export gives
// bitwise-identical fp32 parameters; with the Python environment, transformers loads it with no
// missing or unexpected keys and its logits match titan's.
TEST_P(HfRoundTrip, TrainExportImport) {
  const std::string src = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/" + GetParam();
  const std::string dump = temp_dir("hf_" + GetParam());
  config::JobConfig c = small(dump);
  c.model = config::ModelConfig{};
  c.model.hf_assets_path = src;
  c.training.seq_len = 16;
  c.training.steps = 3;
  c.checkpoint.initial_load_in_hf = true;
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.last_save_in_hf = true;
  c.checkpoint.interval = 100;
  train::Trainer t(c, docs());
  // The initial weights are the fixture's.
  SafetensorsSet fixture = SafetensorsSet::open(src);
  std::vector<float> emb(static_cast<size_t>(t.model().param("tok_embeddings.weight").numel));
  fixture.read_f32("model.embed_tokens.weight", t.model().param("tok_embeddings.weight").shape,
                   emb.data());
  EXPECT_EQ(0, std::memcmp(emb.data(), t.model().param_ptr("tok_embeddings.weight"),
                           emb.size() * sizeof(float)));
  for (int i = 0; i < 3; ++i) {
    t.step();
    t.maybe_checkpoint();
  }
  const std::string out = dump + "/checkpoint/step-3";
  ASSERT_TRUE(fs::exists(out + "/config.json"));
  ASSERT_TRUE(fs::exists(out + "/generation_config.json"));
  SafetensorsSet exported = SafetensorsSet::open(out);
  const auto& args = dynamic_cast<qwen3::Qwen3Model&>(t.model()).args();
  if (args.tie_embeddings) {
    EXPECT_EQ(exported.find("lm_head.weight"), nullptr);
  }
  qwen3::Qwen3Model back(args, 1, 16);
  load_model_weights(back, out, true);
  EXPECT_EQ(0, std::memcmp(back.store().param_data(), t.model().store().param_data(),
                           static_cast<size_t>(back.num_params()) * sizeof(float)));

  const std::string py = std::string(TITAN_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py))
    GTEST_SKIP() << "no Python environment (tools/setup_venv.sh): skipped the transformers check";
  // titan's logits for the fixture's tokens, then transformers on the export.
  const std::string logits = dump + "/logits.safetensors";
  std::string cmd =
      std::string(TITAN_BINARY) +
      " eval --config qwen3_debugmodel --training.seq_len 16 --training.mixed_precision_param "
      "float32 --model.hf_assets_path " +
      out + " --eval.tokens_path " + src + "/expected.safetensors --eval.logits_out " + logits +
      " > " + dump + "/eval.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  cmd = py + " " + TITAN_SOURCE_DIR + "/tools/check_hf_export.py " + out + " --logits " + logits +
        " --atol 1e-4 > " + dump + "/check.log 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dump + "/check.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << text;
  std::printf("%s", text.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfRoundTrip,
                         ::testing::Values("tied_gqa2", "untied_gqa1", "moe_norm",
                                           "moe_nonorm_dense1"));

}  // namespace
}  // namespace titan::ckpt

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;
using titan::testing::error_of;

// Runs `steps` steps of the small job, saving when due; returns the losses.
std::vector<double> run_steps(const config::JobConfig& c, int steps) {
  train::Trainer t(c, docs());
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    losses.push_back(t.step().loss);
    t.maybe_checkpoint();
  }
  return losses;
}

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

void write_json_file(const std::string& path, const json& j) { std::ofstream(path) << j.dump(); }

// The message of constructing a trainer on c ("" when it succeeds).
std::string resume_error(const config::JobConfig& c) {
  return error_of([&] { train::Trainer t(c, docs()); });
}

// What the trainer logs while constructing on c.
std::string resume_log(const config::JobConfig& c) {
  ::testing::internal::CaptureStdout();
  { train::Trainer t(c, docs()); }
  return ::testing::internal::GetCapturedStdout();
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The names in dir other than step-N directories (temporaries left behind).
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp") != std::string::npos || n.find(".old") != std::string::npos ||
        n.find(".del") != std::string::npos)
      r.push_back(n);
  }
  return r;
}

TEST(CheckpointResume, BadDataLoaderPositionIsAnErrorNamingTheFile) {
  const std::string dump = temp_dir("bad_cursor");
  run_steps(small(dump), 2);
  const std::string st = dump + "/checkpoint/step-2/train_state.json";
  const json good = read_json_file(st);
  fs::remove(dump + "/checkpoint/step-2/checksums.json");  // hand-edited below
  for (const auto& [field, value, needle] : std::vector<std::tuple<std::string, json, std::string>>{
           {"cursor", 1 << 30, "\"cursor\" 1073741824 is outside"},
           {"order", json::array({0, 1}), "\"order\" lists 2 documents, this rank has 30"},
           {"input", json::array({1, 2, 99999}), "\"input\"[2] is 99999"}}) {
    json j = good;
    j["dataloader"][field] = value;
    write_json_file(st, j);
    const std::string err = resume_error(small(dump));
    EXPECT_TRUE(has(err, st + ": dataloader state: ") && has(err, needle)) << err;
  }
}

TEST(CheckpointResume, WrongTypesInTrainStateNameFileAndField) {
  const std::string dump = temp_dir("bad_types");
  run_steps(small(dump), 2);
  const std::string st = dump + "/checkpoint/step-2/train_state.json";
  const json good = read_json_file(st);
  fs::remove(dump + "/checkpoint/step-2/checksums.json");
  for (const auto& [key, value, needle] : std::vector<std::tuple<std::string, json, std::string>>{
           {"step", "two", "\"step\" must be a non-negative integer, got \"two\""},
           {"step", -2, "\"step\" must be a non-negative integer"},
           {"step", 3, "\"step\" is 3 but the folder is step-2"},
           {"tokens_seen", json::array(), "\"tokens_seen\" must be a non-negative integer"},
           {"dataloader", 5, "\"dataloader\" must be a JSON object"},
           {"optimizer_state_dtype", "int4",
            "\"optimizer_state_dtype\" is \"int4\", not a dtype this titan reads (float32, "
            "bfloat16, int8)"}}) {
    json j = good;
    j[key] = value;
    write_json_file(st, j);
    const std::string err = resume_error(small(dump));
    EXPECT_TRUE(has(err, st + ": " + needle)) << err;
  }
  std::ofstream(st) << "{\"step\": 2,";
  EXPECT_TRUE(has(resume_error(small(dump)), st + ": invalid JSON"));
  write_json_file(st, json::array());
  EXPECT_TRUE(has(resume_error(small(dump)), st + ": not a JSON object"));
}

// Trains 4 steps with the moments in `state_dtype`, checkpointing at step 2; checks that step 2's
// moments were saved as `saved` tensors with the dtype recorded, that a resume from step 2 gives
// steps 3 and 4 bitwise, and that a float32 run loading them warns of the conversion. Returns
// the losses and the resuming config.
std::pair<std::vector<double>, config::JobConfig> expect_moments_resume_bitwise(
    const std::string& dump, const std::string& state_dtype, DType saved) {
  config::JobConfig c = small(dump);
  c.optimizer.state_dtype = state_dtype;
  const std::vector<double> losses = run_steps(c, 4);
  const std::string step2 = dump + "/checkpoint/step-2";
  const SafetensorsSet opt = SafetensorsSet::open(step2 + "/optimizer.safetensors");
  for (const char* name : {"exp_avg.tok_embeddings.weight", "exp_avg_sq.norm.weight"}) {
    const TensorView* t = opt.find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t) {
      EXPECT_EQ(t->dtype, saved) << name;
    }
  }
  EXPECT_EQ(read_json_file(step2 + "/train_state.json")["optimizer_state_dtype"], state_dtype);
  c.checkpoint.load_step = 2;
  {
    train::Trainer resumed(c, docs());
    EXPECT_EQ(resumed.step().loss, losses[2]);
    EXPECT_EQ(resumed.step().loss, losses[3]);
  }
  config::JobConfig f = c;
  f.optimizer.state_dtype = "float32";
  EXPECT_TRUE(has(resume_log(f), "the checkpoint's AdamW moments are " + state_dtype +
                                     "; this run keeps them in float32 (optimizer.state_dtype): "
                                     "converted"));
  return {losses, f};
}

// optimizer.state_dtype bfloat16: the moments are saved as BF16 tensors and the train state says
// so; a resume continues bitwise. A float32 run resumes from them (widened exactly, so its first
// loss is the same; a warning says the resume is not bitwise), and a bfloat16 run from a float32
// checkpoint.
TEST(CheckpointResume, Bf16MomentsAreSavedInBf16AndResumeBitwise) {
  const auto [losses, f] =
      expect_moments_resume_bitwise(temp_dir("bf16_state"), "bfloat16", DType::BF16);
  {
    train::Trainer widened(f, docs());
    EXPECT_EQ(widened.step().loss, losses[2]);
    EXPECT_NEAR(widened.step().loss, losses[3], 1e-2 * std::abs(losses[3]));
  }
  const std::string dump32 = temp_dir("f32_state");
  const std::vector<double> l32 = run_steps(small(dump32), 2);
  config::JobConfig b = small(dump32);
  b.optimizer.implementation = "fused_opt_states_bf16";
  b.checkpoint.load_step = 2;
  train::Trainer narrowed(b, docs());
  EXPECT_EQ(narrowed.current_step(), 2);
  EXPECT_TRUE(std::isfinite(narrowed.step().loss));
}

// optimizer.state_dtype int8: the moments are saved decoded, as F32 tensors, and the train state
// says int8; a resume finds every block's scale and codes again and continues bitwise. A float32
// run resumes from them with a warning.
TEST(CheckpointResume, Int8MomentsAreSavedAsF32AndResumeBitwise) {
  expect_moments_resume_bitwise(temp_dir("int8_state"), "int8", DType::F32);
}

TEST(CheckpointResume, ChecksumCatchesABitFlipAndNamesAnOlderStep) {
  const std::string dump = temp_dir("bitflip");
  run_steps(small(dump), 4);
  const std::string model = dump + "/checkpoint/step-4/model.safetensors";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c;
    f.read(&c, 1);
    c ^= 0x10;  // one bit of one weight
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
  }
  const std::string err = resume_error(small(dump));
  EXPECT_TRUE(has(err, model + ": checksum mismatch")) << err;
  EXPECT_TRUE(has(err, "--checkpoint.load_step 2")) << err;
  const auto size = fs::file_size(model);
  fs::resize_file(model, size - 8);
  EXPECT_TRUE(has(resume_error(small(dump)), model + ": " + std::to_string(size - 8) +
                                                 " bytes, but checksums.json records " +
                                                 std::to_string(size)))
      << resume_error(small(dump));
  config::JobConfig c = small(dump);
  c.checkpoint.load_step = 2;
  EXPECT_EQ(resume_error(c), "");
  // A checkpoint without checksums.json (an older titan's) loads, with a warning.
  fs::remove(dump + "/checkpoint/step-2/checksums.json");
  EXPECT_TRUE(has(resume_log(c), "step-2 has no checksums.json"));
}

TEST(CheckpointResume, NewestStepMissingAFileIsRefusedWithTheOlderStep) {
  const std::string dump = temp_dir("incomplete");
  run_steps(small(dump), 4);
  fs::remove(dump + "/checkpoint/step-4/optimizer.safetensors");
  const std::string err = resume_error(small(dump));
  EXPECT_TRUE(has(err, "step-4 lacks optimizer.safetensors")) << err;
  EXPECT_TRUE(has(err,
                  "step 2 is the newest older complete checkpoint: resume it with "
                  "--checkpoint.load_step 2"))
      << err;
  fs::remove(dump + "/checkpoint/step-2/train_state.json");
  EXPECT_TRUE(has(resume_error(small(dump)), "no older complete checkpoint"));
}

TEST(CheckpointResume, StateWithoutDataLoaderPositionWarns) {
  const std::string dump = temp_dir("no_dataloader");
  run_steps(small(dump), 2);
  const std::string st = dump + "/checkpoint/step-2/train_state.json";
  json j = read_json_file(st);
  j.erase("dataloader");
  write_json_file(st, j);
  fs::remove(dump + "/checkpoint/step-2/checksums.json");
  EXPECT_TRUE(has(resume_log(small(dump)),
                  "has no dataloader position; the data order restarts from the first document"));
}

TEST(CheckpointResume, ChangedDataSettingsAreRefusedOrWarned) {
  const std::string dump = temp_dir("settings");
  run_steps(small(dump), 2);
  const std::string st = dump + "/checkpoint/step-2/train_state.json";
  const json saved = read_json_file(st)["data"];
  EXPECT_EQ(saved, json({{"tokenizer", "byte"},
                         {"local_batch_size", 2},
                         {"global_batch_size", 2},
                         {"seq_len", 32}}));
  config::JobConfig c = small(dump);
  c.training.seq_len = 16;
  EXPECT_TRUE(has(resume_error(c), st + ": the checkpoint was trained with training.seq_len 32, "
                                        "this run has 16"))
      << resume_error(c);
  c = small(dump);
  c.training.local_batch_size = 4;
  EXPECT_TRUE(has(resume_log(c),
                  "training.local_batch_size was 2 when the checkpoint was saved, "
                  "this run has 4"));
  // Another tokenizer (recorded by hand: the test model's vocabulary fits only the byte one).
  json j = read_json_file(st);
  j["data"]["tokenizer"] = "/models/other-tokenizer";
  write_json_file(st, j);
  fs::remove(dump + "/checkpoint/step-2/checksums.json");
  EXPECT_TRUE(has(resume_error(small(dump)),
                  "trained with dataloader.tokenizer '/models/other-tokenizer', this run has "
                  "'byte'"))
      << resume_error(small(dump));
}

TEST(CheckpointResume, StepPastTrainingStepsIsAnError) {
  const std::string dump = temp_dir("past_steps");
  run_steps(small(dump), 4);
  config::JobConfig c = small(dump);
  c.training.steps = 3;
  EXPECT_TRUE(has(resume_error(c), "step-4 is at step 4, past training.steps = 3"))
      << resume_error(c);
}

// A finished run (model-only export at training.steps) started again does nothing; with
// training.steps raised it resumes the newest full checkpoint, saying so.
TEST(CheckpointResume, FinishedRunIsANoOp) {
  const std::string dump = temp_dir("finished");
  config::JobConfig c = small(dump);
  c.checkpoint.last_save_model_only = true;
  c.metrics.enable_jsonl = true;
  c.metrics.peak_flops = 1e11;
  c.metrics.log_freq = 1;
  { train::Trainer(c, docs()).train(); }
  const auto stamp = fs::last_write_time(dump + "/checkpoint/step-4");
  const auto metrics = fs::file_size(dump + "/metrics.jsonl");
  ::testing::internal::CaptureStdout();
  {
    train::Trainer t(c, docs());
    EXPECT_EQ(t.current_step(), 4);
    t.train();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(has(out, "Already at step 4 = training.steps; nothing to train")) << out;
  EXPECT_FALSE(has(out, "step:  4")) << out;
  EXPECT_EQ(fs::last_write_time(dump + "/checkpoint/step-4"), stamp);
  EXPECT_EQ(fs::file_size(dump + "/metrics.jsonl"), metrics);
  c.training.steps = 6;
  const std::string log = resume_log(c);
  EXPECT_TRUE(has(log, "step-4 holds only the model exported at the end of a run")) << log;
  EXPECT_TRUE(has(log, "resuming from " + dump + "/checkpoint/step-2, the newest full")) << log;
}

// Resuming from step 2 after a run reached step 4: metrics.jsonl holds each step once, with the
// uninterrupted run's losses.
TEST(CheckpointResume, MetricsHaveNoDuplicateStepsAfterResume) {
  const std::string dump = temp_dir("metrics_dup");
  config::JobConfig c = small(dump);
  c.metrics.enable_jsonl = true;
  c.metrics.peak_flops = 1e11;
  c.metrics.log_freq = 1;
  auto records = [&] {
    std::vector<std::pair<int64_t, double>> r;
    std::ifstream f(dump + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line);
      r.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    }
    return r;
  };
  { train::Trainer(c, docs()).train(); }
  const auto first = records();
  ASSERT_EQ(first.size(), 4u);
  c.checkpoint.load_step = 2;
  { train::Trainer(c, docs()).train(); }
  EXPECT_EQ(records(), first);
  // A line cut short by a kill is dropped too.
  std::ofstream(dump + "/metrics.jsonl", std::ios::app) << "{\"step\": 5, \"lo";
  { train::Trainer(c, docs()).train(); }
  EXPECT_EQ(records(), first);
}

TEST(CheckpointResume, EmptyDumpFolderIsRefused) {
  config::JobConfig c = small("");
  EXPECT_TRUE(has(resume_error(c), "dump_folder is empty")) << resume_error(c);
  c.checkpoint.enable = false;
  EXPECT_TRUE(has(resume_error(c), "dump_folder is empty"));
}

// What a killed run leaves is removed at the next start (only where its PID no longer runs); an
// .old folder whose step is missing (killed between the two renames of a replacement) is put
// back.
TEST(CheckpointResume, StaleTemporariesAreCleanedAtStart) {
  const std::string dump = temp_dir("stale");
  run_steps(small(dump), 4);
  const std::string ck = dump + "/checkpoint";
  const std::string dead = "4194309";  // above Linux's PID limit: never a running process
  const std::string live = std::to_string(getppid());
  fs::create_directories(ck + "/step-6.tmp-" + dead);
  std::ofstream(ck + "/step-6.tmp-" + dead + "/model.safetensors") << "half";
  fs::create_directories(ck + "/step-2.old-" + dead);  // step-2 exists: a stale copy
  fs::create_directories(ck + "/step-1.del-" + dead);
  fs::create_directories(ck + "/step-8.tmp-" + live);  // another run, still writing
  fs::rename(ck + "/step-4", ck + "/step-4.old-" + dead);
  const std::string log = resume_log(small(dump));
  EXPECT_TRUE(has(log, "Removed 3 unfinished folder(s)")) << log;
  EXPECT_TRUE(has(log, "Restored step-4.old-" + dead)) << log;
  EXPECT_TRUE(has(log, "Resuming from checkpoint " + ck + "/step-4 at step 4")) << log;
  EXPECT_EQ(leftovers(ck), std::vector<std::string>{"step-8.tmp-" + live});
}

// Saving a step that exists (a resumed run re-training it) replaces it whole: with
// renameat2(RENAME_EXCHANGE), and with the two-rename fallback; nothing is left beside it.
TEST(CheckpointResume, ReplacingAStepLeavesOnlyTheNewOne) {
  for (bool exchange : {true, false}) {
    const std::string dump = temp_dir(exchange ? "replace_x" : "replace_r");
    if (!exchange) setenv("TITAN_TEST_DISABLE", "rename_exchange", 1);
    config::JobConfig c = small(dump);
    run_steps(c, 4);
    const std::string model4 = dump + "/checkpoint/step-4/model.safetensors";
    std::ofstream(dump + "/checkpoint/step-4/marker") << "old";
    c.checkpoint.load_step = 2;
    run_steps(c, 2);
    unsetenv("TITAN_TEST_DISABLE");
    EXPECT_FALSE(fs::exists(dump + "/checkpoint/step-4/marker")) << exchange;
    EXPECT_TRUE(verify_checksums(dump + "/checkpoint/step-4"));
    EXPECT_TRUE(leftovers(dump + "/checkpoint").empty()) << exchange;
  }
}

}  // namespace
}  // namespace titan::ckpt
