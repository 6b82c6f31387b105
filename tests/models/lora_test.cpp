// LoRA adapters (models/lora.h) against the real PEFT: fixtures made by tools/make_lora_fixtures.py
// (tests/fixtures/lora/NAME: a PEFT adapter saved by save_pretrained with random A and B, and for
// the batch of tests/fixtures/hf/NAME the adapted model's fp32 logits, loss and the gradient of
// every adapter tensor). titan loads the base from tests/fixtures/hf/NAME and the adapter through
// lora.adapter_path and must reproduce them.
//
// Tolerances (fp32 on both sides, different summation orders; the base's own parity with
// transformers is 1e-4 on logits, tests/models/qwen3/hf_parity_test.cpp, with O(10) logits):
//   logits: max |Δ| <= 1e-5 (logits up to ~10, fp32 rounding through 2-3 layers: achieved
//   2e-6..8e-6, printed);
//   loss: relative 1e-5;
//   adapter gradients: per tensor ||Δ|| / ||ref|| <= 1e-4.
#include "titan/models/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/models/registry.h"

namespace titan::models {
namespace {

std::string hf_dir(const std::string& n) {
  return std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/" + n;
}
std::string lora_dir(const std::string& n) {
  return std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/lora/" + n;
}

std::vector<int32_t> ids_of(const ckpt::TensorView& t) {
  std::vector<int32_t> r(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t v;
    std::memcpy(&v, t.data + 8 * i, 8);
    r[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return r;
}

// The base fixture's batch in titan's form (HF labels shifted, positions 0..S-1).
struct Fixture {
  int64_t B = 0, S = 0;
  std::vector<int32_t> input, labels, positions;
};
Fixture batch_of(const std::string& name) {
  auto exp = ckpt::SafetensorsSet::open(hf_dir(name) + "/expected.safetensors");
  Fixture f;
  const ckpt::TensorView* ids = exp.find("input_ids");
  f.B = ids->shape[0];
  f.S = ids->shape[1];
  f.input = ids_of(*ids);
  const std::vector<int32_t> hf = ids_of(*exp.find("labels"));
  for (int64_t b = 0; b < f.B; ++b)
    for (int64_t s = 0; s < f.S; ++s) {
      f.labels.push_back(s + 1 < f.S ? hf[static_cast<size_t>(b * f.S + s + 1)] : -100);
      f.positions.push_back(static_cast<int32_t>(s));
    }
  return f;
}

config::JobConfig job(const std::string& name, int64_t B, int64_t S) {
  config::JobConfig c;
  c.model.hf_assets_path = hf_dir(name);
  c.model.attn_mask_type = "causal";
  c.training.local_batch_size = B;
  c.training.seq_len = S;
  c.training.mixed_precision_param = "float32";
  c.lora.adapter_path = lora_dir(name);
  return c;
}

std::unique_ptr<Model> adapted(const config::JobConfig& c) {
  BuildOptions o;
  o.batch = c.training.local_batch_size;
  o.seq_len = c.training.seq_len;
  o.loss_chunks = 3;
  o.log_overrides = false;
  std::unique_ptr<Model> m = build_model(c, o);
  ckpt::load_model_and_adapter(*m, c.model.hf_assets_path, true, c.lora.adapter_path);
  return m;
}

class LoraParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraParity, LogitsLossAndAdapterGradientsMatchPeft) {
  const std::string name = GetParam();
  Fixture f = batch_of(name);
  const config::JobConfig c = job(name, f.B, f.S);
  std::unique_ptr<Model> m = adapted(c);
  ASSERT_NE(m->frozen_base(), nullptr);
  EXPECT_FALSE(m->frozen_base()->store().trainable());
  EXPECT_EQ(m->frozen_base()->store().grads(), nullptr);  // no gradient buffer for the base
  const int64_t V = m->vocab_size(), T = f.B * f.S;
  auto exp = ckpt::SafetensorsSet::open(lora_dir(name) + "/expected.safetensors");
  Batch b{f.B, f.S, f.input.data(), f.labels.data(), f.positions.data()};

  std::vector<float> logits(static_cast<size_t>(T * V)), ref(logits.size()), base(logits.size());
  m->forward_logits(b, logits.data());
  exp.read_f32("logits", {f.B, f.S, V}, ref.data());
  exp.read_f32("base_logits", {f.B, f.S, V}, base.data());
  double max_d = 0, max_base = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_d = std::max(max_d, static_cast<double>(std::fabs(logits[i] - ref[i])));
    max_base = std::max(max_base, static_cast<double>(std::fabs(base[i] - ref[i])));
  }
  EXPECT_LE(max_d, 1e-5);
  EXPECT_GT(max_base, 0.1);  // the adapters matter
  std::printf("[ %s ] logits max |titan - peft| = %.3g (the adapters move them by up to %.3g)\n",
              name.c_str(), max_d, max_base);

  int64_t count = 0;
  for (int32_t l : f.labels) count += l != -100;
  m->zero_grad();
  const ops::LossSum ls = m->forward_backward(b, 1.0f / static_cast<float>(count));
  double loss = ls.sum / static_cast<double>(count);
  if (const auto* r = m->routing(); r && r->aux_loss_coef())
    loss += *r->aux_loss_coef() * r->last_aux_loss();
  float ref_loss = 0;
  exp.read_f32("loss", {}, &ref_loss);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));

  double worst = 0;
  int64_t tensors = 0;
  for (const auto& t : m->hf().hf_tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> g(static_cast<size_t>(n));
    exp.read_f32("grad." + t.key, t.shape, g.data());
    const double rel = titan::testing::relative_l2(m->store().grads() + t.offset, g.data(), n);
    EXPECT_LE(rel, 1e-4) << t.key;
    worst = std::max(worst, rel);
    ++tensors;
  }
  std::printf("[ %s ] %lld adapter gradients, worst ||Δ||/||ref|| = %.3g; loss %.7f vs %.7f\n",
              name.c_str(), static_cast<long long>(tensors), worst, loss, ref_loss);
  EXPECT_EQ(tensors, static_cast<int64_t>(exp.names().size()) - 5);  // + logits, loss, ...
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity,
                         ::testing::Values("tied_gqa2", "untied_gqa4", "moe_nonorm_dense1"));

// The adapters' input dropout acts only in training passes, and each forward_backward draws a
// fresh mask (PEFT's nn.Dropout before lora_A; evaluation runs without it). That the backward
// uses the forward's mask is not checked here against a finite difference.
TEST(Lora, DropoutOnlyWhileTrainingWithAFreshMaskEachPass) {
  Fixture f = batch_of("tied_gqa2");
  config::JobConfig c = job("tied_gqa2", f.B, f.S);
  c.lora.dropout = 0.3;
  std::unique_ptr<Model> m = adapted(c);
  Batch b{f.B, f.S, f.input.data(), f.labels.data(), f.positions.data()};
  std::vector<float> l0(static_cast<size_t>(f.B * f.S * m->vocab_size())), l1(l0.size());
  m->forward_logits(b, l0.data());  // no dropout outside training: deterministic
  m->forward_logits(b, l1.data());
  EXPECT_EQ(l0, l1);
  // Two training passes draw different masks: different losses.
  m->zero_grad();
  const double a = m->forward_backward(b, 1.0f).sum;
  const double a2 = m->forward_backward(b, 1.0f).sum;
  EXPECT_NE(a, a2);
}

// Under bf16 mixed precision the frozen base keeps its projections as their bf16 copy only
// (release_masters): the same logits bitwise, a quarter of their bytes given back, and
// param_data() widens them back (each weight its bf16 rounding).
TEST(Lora, FrozenBf16BaseKeepsOnlyTheCopyOfItsProjections) {
  Fixture f = batch_of("untied_gqa4");
  config::JobConfig c = job("untied_gqa4", f.B, f.S);
  c.training.mixed_precision_param = "bfloat16";
  std::unique_ptr<Model> m = adapted(c);  // load_model_and_adapter releases the masters
  Model& base = *m->frozen_base();
  Batch b{f.B, f.S, f.input.data(), f.labels.data(), f.positions.data()};
  std::vector<float> released(static_cast<size_t>(f.B * f.S * m->vocab_size()));
  m->forward_logits(b, released.data());
  EXPECT_LT(base.store().master_bytes(), 4 * base.num_params() / 2);  // norms and embedding only
  EXPECT_EQ(models::frozen_bytes(*m), base.store().master_bytes());
  const float* w = base.store().param_data();  // widened back
  std::vector<float> orig(static_cast<size_t>(base.num_params()));
  {
    config::JobConfig plain = c;
    plain.lora.adapter_path.clear();
    BuildOptions o;
    o.batch = f.B;
    o.seq_len = f.S;
    o.log_overrides = false;
    auto full = build_model(plain, o);
    ckpt::load_model_weights(*full, c.model.hf_assets_path, true);
    std::copy_n(full->store().param_data(), full->num_params(), orig.begin());
  }
  // The untied lm_head (a projection: its bf16 copy widened) and the final norm (kept in fp32).
  const ParamInfo& head = base.param("lm_head.weight");
  const ParamInfo& norm = base.param("norm.weight");
  int64_t changed = 0;
  for (int64_t i = head.offset; i < head.offset + head.numel; ++i) {
    EXPECT_EQ(w[i], round_to_bf16(orig[static_cast<size_t>(i)]));
    changed += w[i] != orig[static_cast<size_t>(i)];
  }
  EXPECT_GT(changed, 0);
  for (int64_t i = norm.offset; i < norm.offset + norm.numel; ++i)
    EXPECT_EQ(w[i], orig[static_cast<size_t>(i)]);
  std::vector<float> restored(released.size());
  m->forward_logits(b, restored.data());
  EXPECT_EQ(restored, released);
}

TEST(Lora, BadTargetsAndAdaptersAreOneClearError) {
  Fixture f = batch_of("tied_gqa2");
  config::JobConfig c = job("tied_gqa2", f.B, f.S);
  c.lora.adapter_path.clear();
  c.lora.rank = 4;
  c.lora.target_modules = "wq,qkv_proj";
  try {
    adapted(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora.target_modules: 'qkv_proj'"), std::string::npos)
        << e.what();
  }
  // An adapter of another shape: its keys named.
  c.lora.target_modules = "wq,wk,wv,wo";
  c.lora.rank = 4;
  std::unique_ptr<Model> m = adapted(c);
  try {
    ckpt::load_model_weights(*m, lora_dir("tied_gqa2"), true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected keys: base_model.model.model.layers.0.mlp"),
              std::string::npos)
        << e.what();
  }
  // A directory that is no adapter.
  c.lora.adapter_path = hf_dir("tied_gqa2");
  try {
    adapted(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adapter_config.json"), std::string::npos) << e.what();
  }
}

// adapter_config.json's fields are checked where they are read, the file and field named.
TEST(Lora, AdapterConfigFieldsAreChecked) {
  const std::string file = testing::fresh_temp_dir("lora_adapter_config") + "/adapter_config.json";
  const std::string good =
      R"("peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"])";
  auto error_for = [&](const std::string& text) {
    std::ofstream(file) << text;
    LoraOptions o;
    return testing::error_of([&] { read_adapter_config(file, &o); });
  };
  EXPECT_EQ(error_for("{" + good + "}"), "");
  for (const auto& [edit, says] : std::vector<std::pair<std::string, std::string>>{
           {R"("peft_type": "PREFIX_TUNING")", "field 'peft_type' must be \"LORA\""},
           {R"("r": "8")", "field 'r' must be a positive integer, got \"8\""},
           {R"("r": 0)", "field 'r' must be a positive integer, got 0"},
           {R"("r": 2.5)", "field 'r' must be a positive integer"},
           {R"("lora_alpha": "16")", "field 'lora_alpha' must be a positive number, got \"16\""},
           {R"("lora_alpha": -2)", "field 'lora_alpha' must be a positive number"},
           {R"("use_dora": true)", "field 'use_dora' is true: DoRA adapters are not supported"},
           {R"("use_rslora": "yes")", "field 'use_rslora' must be true or false"},
           {R"("target_modules": 5)", "field 'target_modules' must be a string or a list"},
           {R"("target_modules": ["q_proj", 1])", "field 'target_modules' must be a string"}}) {
    // The edited field comes last: nlohmann keeps the last of a repeated key.
    const std::string e = error_for("{" + good + ", " + edit + "}");
    EXPECT_NE(e.find(file + ": " + says), std::string::npos) << edit << ": " << e;
  }
  EXPECT_NE(error_for("[1, 2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_for("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_for(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8})")
                .find("field 'target_modules' must be"),
            std::string::npos);
}

}  // namespace
}  // namespace titan::models
