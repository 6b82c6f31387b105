// Activation checkpointing: every mode gives bitwise the losses and gradients of no checkpointing
// (same kernels on the same inputs), for a dense and an MoE model with the auxiliary loss and the
// expert bias on, and keeps fewer saved bytes in its size table.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {
namespace {

using models::AcPolicy;

Qwen3Args tiny(bool moe) {
  Qwen3Args a;
  a.vocab_size = 64;
  a.dim = 32;
  a.n_layers = 4;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.hidden_dim = 48;
  a.max_seq_len = 32;
  a.tie_embeddings = false;
  if (moe) {
    a.num_experts = 6;
    a.top_k = 2;
    a.moe_hidden_dim = 12;
    a.mlp_only_layers = {1};  // one dense layer among the MoE ones
    a.router_aux_loss = true;
    a.router_aux_loss_coef = 0.05;
    a.load_balance_coeff = 1e-3;
  }
  return a;
}

struct Result {
  double loss = 0, aux = 0;
  std::vector<float> grads, bias;
  int64_t saved_bytes = 0;
};

Result run(const Qwen3Args& a, AcPolicy ac, DType compute) {
  const int64_t B = 2, S = 12;
  Qwen3Model m(a, {.max_batch = B, .max_seq = S, .ac = ac, .compute = compute});
  m.init_weights(7, 0.1f);
  std::mt19937 rng(3);
  std::vector<int32_t> in(B * S), lab(B * S), pos(B * S);
  for (int64_t t = 0; t < B * S; ++t) {
    in[t] = static_cast<int32_t>(rng() % a.vocab_size);
    lab[t] = static_cast<int32_t>(rng() % a.vocab_size);
    pos[t] = static_cast<int32_t>(t % S < 5 ? t % S : t % S - 5);
  }
  Result r;
  // Two steps: the second one routes with the bias the first one's load set.
  for (int step = 0; step < 2; ++step) {
    m.zero_grad();
    r.loss = m.forward_backward({B, S, in.data(), lab.data(), pos.data()}, 1.0f / (B * S)).sum;
    r.aux = m.last_aux_loss();
    m.finish_step();
  }
  r.grads.assign(m.store().grads(), m.store().grads() + m.num_params());
  for (const auto& b : m.buffers()) r.bias.insert(r.bias.end(), b.data, b.data + b.shape[0]);
  for (const auto& t : m.activation_table()) r.saved_bytes += t.saved ? t.aligned_bytes() : 0;
  return r;
}

void expect_bitwise_in_every_mode(bool moe, DType compute = DType::F32) {
  const Qwen3Args a = tiny(moe);
  const Result none = run(a, {}, compute);
  for (AcPolicy ac :
       {AcPolicy::from_config("full", "2"), AcPolicy::from_config("selective", "2"),
        AcPolicy::from_config("selective", "3"), AcPolicy::from_config("selective", "op")}) {
    SCOPED_TRACE(ac.describe());
    const Result r = run(a, ac, compute);
    EXPECT_EQ(std::memcmp(&r.loss, &none.loss, sizeof(double)), 0) << r.loss << " " << none.loss;
    EXPECT_EQ(std::memcmp(&r.aux, &none.aux, sizeof(double)), 0);
    ASSERT_EQ(r.grads.size(), none.grads.size());
    EXPECT_EQ(std::memcmp(r.grads.data(), none.grads.data(), r.grads.size() * sizeof(float)), 0);
    EXPECT_EQ(r.bias, none.bias);
    EXPECT_LT(r.saved_bytes, none.saved_bytes);
  }
}

TEST(ActivationCheckpoint, DenseBitwiseIdenticalInEveryMode) {
  expect_bitwise_in_every_mode(false);
}
TEST(ActivationCheckpoint, MoeBitwiseIdenticalInEveryMode) { expect_bitwise_in_every_mode(true); }
// bf16 mixed precision: the recomputation rounds the same fp32 values to bf16 again.
TEST(ActivationCheckpoint, DenseBf16BitwiseIdenticalInEveryMode) {
  expect_bitwise_in_every_mode(false, DType::BF16);
}
TEST(ActivationCheckpoint, MoeBf16BitwiseIdenticalInEveryMode) {
  expect_bitwise_in_every_mode(true, DType::BF16);
}

TEST(ActivationCheckpoint, FullKeepsOnlyEachBlocksInput) {
  const Qwen3Args a = tiny(false);
  Qwen3Model m(
      a,
      {.max_batch = 2, .max_seq = 12, .allocate = false, .ac = AcPolicy::from_config("full", "2")});
  for (const auto& t : m.activation_table()) {
    if (t.layer >= 0) {
      EXPECT_EQ(t.name, "x");
    }
  }
}

}  // namespace
}  // namespace titan::qwen3
