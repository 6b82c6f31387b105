// The Qwen3 spec's size checks: the parameter count from the arguments alone (before anything is
// allocated), overflow of absurd sizes, and the memory check that refuses a model the machine
// cannot hold with one line instead of std::bad_alloc.
#include "titan/models/qwen3/spec.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/registry.h"

namespace titan::qwen3 {
namespace {

using titan::testing::error_of;

Qwen3Args tiny() {
  Qwen3Args a;
  a.vocab_size = 300;
  a.dim = 32;
  a.n_layers = 3;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.hidden_dim = 64;
  a.max_seq_len = 64;
  return a;
}

TEST(Qwen3Spec, ParamCountMatchesTheBuiltModel) {
  Qwen3Args a = tiny();
  for (bool tied : {true, false}) {
    a.tie_embeddings = tied;
    int64_t n = 0;
    ASSERT_TRUE(a.param_count(&n));
    EXPECT_EQ(n, Qwen3Model(a, 1, 8).num_params()) << "tied " << tied;
  }
  // MoE with a dense layer among sparse ones (decoder_sparse_step 2, mlp_only_layers).
  a.num_experts = 4;
  a.top_k = 2;
  a.moe_hidden_dim = 24;
  a.n_layers = 6;
  a.decoder_sparse_step = 2;
  a.mlp_only_layers = {3, 3, 4};
  int64_t n = 0;
  ASSERT_TRUE(a.param_count(&n));
  EXPECT_EQ(n, Qwen3Model(a, 1, 8).num_params());
}

TEST(Qwen3Spec, OverflowingSizesAreRefused) {
  Qwen3Args a = tiny();
  a.dim = int64_t{1} << 40;
  a.hidden_dim = int64_t{1} << 40;
  int64_t n = 0;
  EXPECT_FALSE(a.param_count(&n));
  const std::string msg = error_of([&] { a.validate(); });
  EXPECT_NE(msg.find("overflow a 64-bit parameter count"), std::string::npos) << msg;
  a = tiny();
  a.num_experts = int64_t{1} << 40;
  a.top_k = 1;
  a.moe_hidden_dim = 8;
  EXPECT_NE(error_of([&] { a.validate(); }).find("model.num_experts 1099511627776 is out of range"),
            std::string::npos);
}

TEST(Qwen3Spec, MemoryCheckNamesTheSizesAndWhatToReduce) {
  const Qwen3Args a = flavor("0.6B");  // 596 million parameters: 8.9 GiB at 16 bytes each
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(error_of([&] {
              check_fits_in_memory(a, 16, "parameters, gradients and optimizer state", 64 * gib,
                                   "flavor '0.6B'");
            }),
            "");
  EXPECT_EQ(error_of([&] {
              check_fits_in_memory(a, 16, "parameters, gradients and optimizer state", 0,
                                   "flavor '0.6B'");
            }),
            "");  // unknown
  std::string msg = error_of([&] {
    check_fits_in_memory(a, 16, "parameters, gradients and optimizer state", 4 * gib,
                         "flavor '0.6B'");
  });
  EXPECT_NE(msg.find("the model (flavor '0.6B') needs 8.88"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameters, gradients and optimizer state"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this machine has 4.0 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reduce model.n_layers, model.dim"), std::string::npos) << msg;
  msg = error_of([&] {
    check_fits_in_memory(a, 8, "parameters and gradients", 4 * gib, "x");
  });  // eval: no optimizer state
  EXPECT_NE(msg.find("for its parameters and gradients;"), std::string::npos) << msg;
}

// intermediate_size 1e10 or a million experts allocated until std::bad_alloc (exit 3).
TEST(Qwen3Spec, AbsurdSizesFailBeforeAllocating) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.model.hidden_dim = 10000000000;
  models::BuildOptions o;
  std::string msg = error_of([&] { models::build_model(c, o); });
  EXPECT_NE(msg.find("the model (flavor 'debugmodel') needs"), std::string::npos) << msg;
  c = titan::testing::tiny_model_job();
  c.model.flavor = "debugmodel_moe";
  c.model.num_experts = 1000000;
  c.model.top_k = 2;
  c.model.moe_hidden_dim = 64;
  msg = error_of([&] { models::build_model(c, o); });
  EXPECT_NE(msg.find("model.num_experts, model.moe_hidden_dim"), std::string::npos) << msg;
}

}  // namespace
}  // namespace titan::qwen3
