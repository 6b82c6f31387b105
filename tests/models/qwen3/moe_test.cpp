// Qwen3-MoE in titan: flavors and parameter counts (torchtitan.md §3.2), the router kernels
// against a direct double-precision computation and finite differences, both load-balancing
// mechanisms, and a small MoE training run (expert load in the metrics, bias in checkpoints).
// Numerical parity with transformers' Qwen3MoeForCausalLM is in hf_parity_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/config/job_config.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/spec.h"
#include "titan/ops/router.h"
#include "titan/plugin/registry.h"
#include "titan/train/trainer.h"

namespace titan::qwen3 {
namespace {

TEST(MoeFlavors, DebugModelMoeMatchesTorchtitanCounts) {
  Qwen3Args a = flavor("debugmodel_moe");
  EXPECT_EQ(a.num_experts, 64);
  EXPECT_EQ(a.top_k, 8);
  EXPECT_EQ(a.n_moe_layers(), 8);
  Qwen3Model m(a, 1, 16);
  int64_t total = 0;
  for (const auto& p : m.params())
    if (!p.alias) total += p.numel;
  EXPECT_EQ(total, 315758848);  // torchtitan.md §3.2
  // Active parameters 51,517,696 less the untied embedding 524,288 enter 6·N.
  EXPECT_EQ(m.num_flop_params(), 51517696 - 524288);
  // torchtitan's count, with the whole attention square (titan's counts its causal half).
  EXPECT_DOUBLE_EQ(
      m.flops_per_token(4096) + models::attention_flops_per_token(m.dims(), 4096, false) / 2,
      1111266816.0);
}

TEST(MoeFlavors, LargeFlavorsAndTheSeedsReducedConfig) {
  const Qwen3Args a = flavor("30B-A3B");
  EXPECT_EQ(a.num_experts, 128);
  EXPECT_EQ(a.top_k, 8);
  EXPECT_EQ(a.moe_hidden_dim, 768);
  EXPECT_EQ(flavor("235B-A22B").n_layers, 94);
  config::register_builtin_configs();
  config::JobConfig c = config::make_config("nki_qwen3_30b_a3b");
  const Qwen3Args r = args_from_config(c);
  EXPECT_EQ(r.n_layers, 4);
  EXPECT_EQ(r.num_experts, 64);
  EXPECT_EQ(r.top_k, 4);
  EXPECT_EQ(r.dim, 2048);
}

TEST(MoeArgs, BadFieldsAreNamed) {
  Qwen3Args a = flavor("debugmodel_moe");
  a.top_k = 65;
  try {
    a.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.top_k"), std::string::npos) << e.what();
  }
  config::JobConfig c;
  c.model.num_experts = 8;  // on a dense flavor without top_k / moe_hidden_dim
  EXPECT_THROW(args_from_config(c), Error);
}

// The router against a direct computation in double, and its backward against central
// differences of L = Σ c·w + Σ e·p (the second term: a dense extra gradient, as the aux loss).
TEST(Router, ForwardAndBackwardMatchReference) {
  const int64_t T = 5, E = 7, K = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> z(T * E), c(T * K), extra(E);
  for (auto& v : z) v = 2 * nd(rng);
  for (auto& v : c) v = nd(rng);
  for (auto& v : extra) v = nd(rng);
  for (bool norm : {false, true}) {
    std::vector<float> p(T * E), w(T * K), dz(T * E);
    std::vector<int32_t> idx(T * K);
    ops::router_fwd(z.data(), nullptr, T, E, K, norm, p.data(), idx.data(), w.data());
    auto loss = [&](const std::vector<float>& zz) {
      double L = 0;
      for (int64_t t = 0; t < T; ++t) {
        double m = -1e30, s = 0;
        for (int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(zz[t * E + e]));
        std::vector<double> q(E);
        for (int64_t e = 0; e < E; ++e) s += q[e] = std::exp(zz[t * E + e] - m);
        double sel = 0;
        for (int64_t j = 0; j < K; ++j) sel += q[idx[t * K + j]] / s;  // selection held fixed
        for (int64_t j = 0; j < K; ++j) {
          const double wj = q[idx[t * K + j]] / s / (norm ? sel : 1.0);
          L += c[t * K + j] * wj;
        }
        for (int64_t e = 0; e < E; ++e) L += extra[e] * q[e] / s;
      }
      return L;
    };
    // Forward: descending order, weights as defined.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 1; j < K; ++j)
        EXPECT_GE(p[t * E + idx[t * K + j - 1]], p[t * E + idx[t * K + j]]);
    ops::router_bwd(p.data(), idx.data(), w.data(), c.data(), extra.data(), T, E, K, norm,
                    dz.data());
    for (int64_t i = 0; i < T * E; ++i) {
      std::vector<float> zp = z, zm = z;
      const float h = 1e-2f;
      zp[i] += h;
      zm[i] -= h;
      const double fd = (loss(zp) - loss(zm)) / (2 * h);
      EXPECT_NEAR(dz[i], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "i=" << i << " norm=" << norm;
    }
  }
}

TEST(Router, TiesGoToTheLowerExpertAndBiasOnlySelects) {
  const int64_t E = 4, K = 2;
  std::vector<float> z = {0, 0, 0, 0}, p(E), w(K), bias = {0, 0, 1, 0};
  std::vector<int32_t> idx(K);
  ops::router_fwd(z.data(), nullptr, 1, E, K, false, p.data(), idx.data(), w.data());
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);
  ops::router_fwd(z.data(), bias.data(), 1, E, K, false, p.data(), idx.data(), w.data());
  EXPECT_EQ(idx[0], 2);          // the bias moves the selection ...
  EXPECT_FLOAT_EQ(w[0], 0.25f);  // ... but the weight is the unbiased probability
}

Qwen3Args tiny_moe() {
  Qwen3Args a;
  a.vocab_size = 64;
  a.dim = 16;
  a.n_layers = 2;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.head_dim = 8;
  a.hidden_dim = 32;
  a.num_experts = 6;
  a.top_k = 2;
  a.moe_hidden_dim = 12;
  return a;
}

// The grouped kernel and the reference loop give the same model losses and gradients.
TEST(MoeModel, GroupedAndReferenceExpertsAgree) {
  const Qwen3Args a = tiny_moe();
  const int64_t B = 2, S = 12;
  std::vector<int32_t> in(B * S), lab(B * S), pos(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    in[i] = static_cast<int32_t>((i * 7) % 64);
    lab[i] = static_cast<int32_t>((i * 5 + 3) % 64);
    pos[i] = static_cast<int32_t>(i % S);
  }
  Batch b{B, S, in.data(), lab.data(), pos.data()};
  Qwen3Model g(a, B, S), r(a, {.max_batch = B,
                               .max_seq = S,
                               .experts_ops = std::vector<ops::GroupedExpertsOp>(
                                   2, ops::grouped_experts_reference_op())});
  g.init_weights(5, 0.2f);
  r.init_weights(5, 0.2f);
  const double lg = g.forward_backward(b, 1.0f / (B * S)).sum;
  const double lr = r.forward_backward(b, 1.0f / (B * S)).sum;
  EXPECT_NEAR(lg, lr, 1e-5 * std::fabs(lr));
  double num = 0, den = 0;
  for (int64_t i = 0; i < g.num_params(); ++i) {
    const double d = g.store().grads()[i] - r.store().grads()[i];
    num += d * d;
    den += static_cast<double>(r.store().grads()[i]) * r.store().grads()[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

// torchtitan's aux-loss-free balancing: the bias steps by ±coeff (centred) against the load,
// counts restart after each step, and the load sums to T·K per layer.
TEST(MoeModel, ExpertBiasFollowsTheLoad) {
  Qwen3Args a = tiny_moe();
  a.load_balance_coeff = 1e-3;
  const int64_t B = 1, S = 16;
  std::vector<int32_t> in(S), lab(S), pos(S);
  for (int64_t i = 0; i < S; ++i) {
    in[i] = static_cast<int32_t>(i % 5);
    lab[i] = static_cast<int32_t>((i + 1) % 5);
    pos[i] = static_cast<int32_t>(i);
  }
  Qwen3Model m(a, B, S);
  m.init_weights(1, 0.2f);
  m.forward_backward({B, S, in.data(), lab.data(), pos.data()}, 1.0f / S);
  std::vector<std::vector<double>> load;
  for (const auto& e : m.expert_load()) load.push_back(*e.tokens);
  ASSERT_EQ(load.size(), 2u);
  for (const auto& l : load) {
    double sum = 0;
    for (double c : l) sum += c;
    EXPECT_EQ(sum, S * a.top_k);
  }
  m.finish_step();
  const auto bufs = m.buffers();
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[0].fqn, "layers.0.moe.expert_bias");
  double mean = 0;
  for (int64_t e = 0; e < a.num_experts; ++e) mean += load[0][e];
  mean /= static_cast<double>(a.num_experts);
  float bias_sum = 0;
  for (int64_t e = 0; e < a.num_experts; ++e) {
    const float b = bufs[0].data[e];
    bias_sum += b;
    if (load[0][e] > mean) {
      EXPECT_LT(b, 0.0f);  // overloaded experts are pushed down
    }
    if (load[0][e] < mean) {
      EXPECT_GT(b, 0.0f);
    }
  }
  EXPECT_NEAR(bias_sum, 0.0f, 1e-6f);
  for (const auto& l : m.expert_load())
    for (double c : *l.tokens) EXPECT_EQ(c, 0.0);
}

std::vector<std::string> docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 30; ++i)
    d.push_back("moe document " + std::to_string(i) + ": experts route tokens " +
                std::string(static_cast<size_t>(i % 7), 'q') + " and balance their load.");
  return d;
}

// MoE layers declare the router's tensors (int32 routing indices) and the experts op's saved
// state in the size table instead of the SwiGLU's.
TEST(Qwen3Moe, SizeTableHasTheRouterAndExpertsState) {
  const Qwen3Args a = tiny_moe();
  Qwen3Model m(a, 1, 8);
  int64_t indices = 0, experts = 0, swiglu = 0;
  for (const auto& t : m.activation_table()) {
    if (t.name == "moe.router.indices") {
      EXPECT_EQ(t.dtype, DType::I32);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{8, a.top_k}));
      ++indices;
    }
    experts += t.name == "moe.experts.saved";
    swiglu += t.name == "feed_forward.w13";
  }
  EXPECT_EQ(indices, a.n_moe_layers());
  EXPECT_EQ(experts, a.n_moe_layers());
  EXPECT_EQ(swiglu, a.n_layers - a.n_moe_layers());
}

config::JobConfig tiny_moe_job(const std::string& dump) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.model.flavor = "debugmodel_moe";
  c.model.num_experts = 8;
  c.model.top_k = 2;
  c.model.moe_hidden_dim = 16;
  c.model.router_aux_loss = true;
  c.training.local_batch_size = 2;
  c.training.seq_len = 32;
  c.training.steps = 4;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 3;
  c.dump_folder = dump;
  c.metrics.enable_jsonl = true;
  c.metrics.log_freq = 1;
  c.metrics.peak_flops = 1e11;
  return c;
}

TEST(MoeTraining, LossFallsAndTheMetricsCarryExpertLoad) {
  const std::string dump = titan::testing::fresh_temp_dir("moe");
  config::JobConfig c = tiny_moe_job(dump);
  c.training.steps = 6;
  train::Trainer t(c, docs());
  t.train();
  std::ifstream f(dump + "/metrics.jsonl");
  std::string line, last;
  int n = 0;
  while (std::getline(f, line)) last = line, ++n;
  EXPECT_EQ(n, 6);
  EXPECT_NE(last.find("\"aux_loss\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"expert_load\":[{\"layer\":0,"), std::string::npos) << last;
  std::filesystem::remove_all(dump);
}

TEST(MoeTraining, ResumeRestoresTheExpertBiasBitwise) {
  const std::string dump = titan::testing::fresh_temp_dir("moe_ck");
  config::JobConfig c = tiny_moe_job(dump);
  c.metrics.enable_jsonl = false;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  std::vector<double> losses;
  {
    train::Trainer t(c, docs());
    for (int i = 0; i < 4; ++i) {
      losses.push_back(t.step().loss);
      t.maybe_checkpoint();
    }
  }
  std::filesystem::remove_all(dump + "/checkpoint/step-4");
  train::Trainer resumed(c, docs());
  EXPECT_EQ(resumed.current_step(), 2);
  EXPECT_EQ(resumed.step().loss, losses[2]);
  EXPECT_EQ(resumed.step().loss, losses[3]);
  std::filesystem::remove_all(dump);
}

}  // namespace
}  // namespace titan::qwen3
