// The override registry (mirroring torchtitan's test_override.py for the named variant) and the
// plugin loader, with the example RoPE plugin.
#include "titan/plugin/registry.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/modules.h"
#include "titan/models/qwen3/spec.h"
#include "titan/tools/check_kernel.h"
#include "titan/train/trainer.h"

namespace titan::plugin {
namespace {

using config::ModuleNode;

std::string plugin(const std::string& name) {
  return std::string(TITAN_PLUGIN_DIR) + "/lib" + name + ".so";
}

qwen3::Qwen3Args args(int64_t layers) {
  qwen3::Qwen3Args a;
  a.n_layers = layers;
  a.dim = 32;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.hidden_dim = 64;
  a.vocab_size = 300;
  a.max_seq_len = 256;
  return a;
}

// An override replacing matched nodes with `type` (registered here, derived from RoPE.Config).
Override make(const std::string& name, const std::string& target,
              std::vector<std::string> fqns = {}, bool exact = false,
              const std::string& type = "MyRoPE.Config") {
  Override o;
  o.name = name;
  o.target = target;
  o.fqns = std::move(fqns);
  o.exact = exact;
  o.factory = [type](const ModuleNode& n) {
    return config::derive(n, Registry::global().module_type(type));
  };
  return o;
}

class OverrideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Registry::global().reset();
    Registry::global().add_module_type(
        {"MyRoPE.Config", {"RoPE.Config"}, {{"op", "cos_sin_rope"}}});
  }
  void TearDown() override { Registry::global().reset(); }
  std::string error_of(std::shared_ptr<ModuleNode>& tree) {
    try {
      apply_overrides(tree, "model", {"titan"});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(OverrideTest, ReplacesEveryInstanceAndLogs) {
  Registry::global().add_override(make("my_rope", "CosSinRoPE.Config"));
  auto tree = qwen3::build_module_tree(args(3), 64);
  OverrideReport r = apply_overrides(tree, "model", {"titan"});
  EXPECT_EQ(r.replaced, 3);
  ASSERT_EQ(r.lines.size(), 4u);
  EXPECT_EQ(r.lines[0],
            "[Override] my_rope: model.layers.0.attention.rope CosSinRoPE.Config -> MyRoPE.Config");
  EXPECT_EQ(r.lines[3], "Applied 3 override(s)");
  EXPECT_EQ(tree->find("layers.2.attention.rope")->type, "MyRoPE.Config");
}

TEST_F(OverrideTest, FqnGlobsSelectNodes) {
  Registry::global().add_override(
      make("my_rope", "RoPE.Config", {"model.layers.1[0-9].attention.rope"}));
  auto tree = qwen3::build_module_tree(args(12), 64);
  EXPECT_EQ(apply_overrides(tree, "model", {"titan"}).replaced, 2);
  EXPECT_EQ(tree->find("layers.9.attention.rope")->type, "CosSinRoPE.Config");
  EXPECT_EQ(tree->find("layers.11.attention.rope")->type, "MyRoPE.Config");
  Registry::global().reset();
  Registry::global().add_module_type({"MyRoPE.Config", {"RoPE.Config"}, {{"op", "cos_sin_rope"}}});
  Registry::global().add_override(make("star", "RoPE.Config", {"*.layers.0.*"}));  // * crosses dots
  tree = qwen3::build_module_tree(args(3), 64);
  EXPECT_EQ(apply_overrides(tree, "model", {"titan"}).replaced, 1);
}

TEST_F(OverrideTest, ExactSkipsSubclasses) {
  Registry::global().add_module_type({"SubRoPE.Config", {"CosSinRoPE.Config", "RoPE.Config"}, {}});
  auto tree = qwen3::build_module_tree(args(2), 64);
  auto* rope0 = tree->find("layers.0.attention.rope");
  rope0->type = "SubRoPE.Config";
  rope0->bases = {"CosSinRoPE.Config", "RoPE.Config"};
  Registry::global().add_override(make("exact", "CosSinRoPE.Config", {}, true));
  EXPECT_EQ(apply_overrides(tree, "model", {"titan"}).replaced, 1);  // only layer 1
  EXPECT_EQ(tree->find("layers.0.attention.rope")->type, "SubRoPE.Config");
  Registry::global().add_override(make("loose", "CosSinRoPE.Config", {"model.layers.0.*"}));
  auto tree2 = qwen3::build_module_tree(args(2), 64);
  tree2->find("layers.0.attention.rope")->type = "SubRoPE.Config";
  tree2->find("layers.0.attention.rope")->bases = {"CosSinRoPE.Config", "RoPE.Config"};
  EXPECT_EQ(apply_overrides(tree2, "model", {"titan"}).replaced, 2);  // exact on 1, loose on 0
}

TEST_F(OverrideTest, SameNodeAndAncestorConflicts) {
  Registry::global().add_override(make("a", "CosSinRoPE.Config"));
  Registry::global().add_override(make("b", "RoPE.Config", {"model.layers.1.*"}));
  auto tree = qwen3::build_module_tree(args(2), 64);
  EXPECT_EQ(error_of(tree),
            "Overrides 'a' and 'b' both claim node 'model.layers.1.attention.rope'. Narrow their "
            "`fqns` selectors so they target disjoint nodes.");
  EXPECT_EQ(tree->find("layers.0.attention.rope")->type, "CosSinRoPE.Config");  // nothing applied

  Registry::global().reset();
  Registry::global().add_module_type({"MyAttn.Config", {"Attention.Config"}, {}});
  Registry::global().add_module_type({"MyRoPE.Config", {"RoPE.Config"}, {{"op", "cos_sin_rope"}}});
  Registry::global().add_override(
      make("attn", "Attention.Config", {"model.layers.0.attention"}, false, "MyAttn.Config"));
  Registry::global().add_override(make("rope", "RoPE.Config"));
  tree = qwen3::build_module_tree(args(2), 64);
  EXPECT_EQ(error_of(tree),
            "Override 'attn' claims 'model.layers.0.attention', an ancestor of "
            "'model.layers.0.attention.rope' claimed by 'rope'. Nested overrides are "
            "order-dependent; narrow their `fqns` selectors.");
}

TEST_F(OverrideTest, RootClaimUnknownAndDuplicateNames) {
  Registry::global().add_override(make("root", "Qwen3Model.Config", {}, false, "MyRoPE.Config"));
  auto tree = qwen3::build_module_tree(args(1), 64);
  EXPECT_NE(error_of(tree).find("claims root config 'model'"), std::string::npos);
  EXPECT_THROW(Registry::global().add_override(make("root", "RoPE.Config")), Error);
  try {
    Registry::global().add_override(make("x", "NoSuch.Config"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("must be a registered module config type, got 'NoSuch.Config'"),
        std::string::npos);
  }
}

TEST_F(OverrideTest, OnlyImportedOverridesApply) {
  Registry::global().add_override(make("my_rope", "RoPE.Config"));
  auto tree = qwen3::build_module_tree(args(2), 64);
  EXPECT_EQ(apply_overrides(tree, "model", {}).replaced, 0);            // empty imports: no-op
  EXPECT_EQ(apply_overrides(tree, "model", {"other.so"}).replaced, 0);  // provenance filter
  EXPECT_EQ(tree->find("layers.0.attention.rope")->type, "CosSinRoPE.Config");
}

TEST_F(OverrideTest, DeriveRules) {
  config::ModuleType target{"T.Config", {}, {{"op", "t_op"}, {"theta", "1"}, {"extra", "e"}}};
  ModuleNode src;
  src.type = "S.Config";
  src.fields = {{"op", "s_op"}, {"theta", "5"}, {"source_only", "x"}};
  auto n = config::derive(src, target, {{"op", "delta_op"}});
  EXPECT_EQ(n->type, "T.Config");
  EXPECT_EQ(n->fields.at("op"), "delta_op");     // delta wins
  EXPECT_EQ(n->fields.at("theta"), "5");         // copied from the source
  EXPECT_EQ(n->fields.at("extra"), "e");         // target default
  EXPECT_FALSE(n->fields.count("source_only"));  // dropped
  try {
    config::derive(src, target, {{"nope", "1"}, {"also", "2"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "derive() got deltas for fields not on T.Config: [also, nope]");
  }
}

TEST(Plugin, LoaderErrorsAreClear) {
  auto msg = [](const std::string& lib) {
    try {
      Registry::global().load(lib);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("/nonexistent/libx.so").find("cannot load plugin '/nonexistent/libx.so'"),
            std::string::npos);
  EXPECT_NE(
      msg(plugin("titan_test_no_register")).find("lacks the entry point titan_plugin_register"),
      std::string::npos);
  EXPECT_NE(msg(plugin("titan_test_bad_version"))
                .find("plugin API version " + std::to_string(TITAN_PLUGIN_API_VERSION + 998)),
            std::string::npos);
  Registry::global().reset();
}

std::vector<std::string> docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 40; ++i) d.push_back("plugin test document number " + std::to_string(i * 31));
  return d;
}

config::JobConfig small(const std::string& imports, int64_t seq) {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.training.local_batch_size = 2;
  c.training.seq_len = seq;
  c.training.steps = 3;
  c.debug.seed = 1;
  c.override_.imports = imports;
  return c;
}

TEST(Plugin, ExampleRopeTrainsBitwiseLikeTheBuiltIn) {
  Registry::global().reset();
  train::Trainer builtin(small("", 128), docs());
  train::Trainer plugged(small(plugin("titan_layout_rope"), 128), docs());
  for (int i = 0; i < 2; ++i) {
    train::StepResult a = builtin.step(), b = plugged.step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  // Its sequence-length rule is enforced before training starts.
  try {
    train::Trainer bad(small(plugin("titan_layout_rope"), 96), docs());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 128, got 96"), std::string::npos) << e.what();
  }
  Registry::global().reset();
}

TEST(Plugin, ThrowingKernelGivesAClearError) {
  Registry::global().reset();
  train::Trainer t(small(plugin("titan_test_throwing"), 32), docs());
  try {
    t.step();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("RoPE op 'throwing_rope' failed in the forward of layer 0: "
                                   "throwing_rope: device fault"),
        std::string::npos)
        << e.what();
  }
  Registry::global().reset();
}

// Ops are keyed by (name, device, dtype): the same name may exist per device, and a lookup for a
// missing pair names what exists.
TEST(OpRegistry, OpsAreKeyedByNameDeviceAndDtype) {
  Registry::global().reset();
  ops::GroupedExpertsOp other = ops::grouped_experts_reference_op();  // a device titan lacks
  other.name = "grouped_experts";
  other.device = "rocm";
  other.dtype = "bfloat16";
  Registry::global().add_op(other);
  EXPECT_EQ(
      Registry::global().op<ops::GroupedExpertsOp>("grouped_experts", "rocm", "bfloat16").device,
      "rocm");
  EXPECT_EQ(Registry::global().op<ops::GroupedExpertsOp>("grouped_experts").device, "cpu");
  EXPECT_THROW(Registry::global().add_op(other), Error);  // same key twice
  try {
    Registry::global().op<ops::RopeOp>("cos_sin_rope", "rocm", "float32");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("for rocm/float32; it exists for cpu/float32"),
              std::string::npos)
        << e.what();
  }
  Registry::global().reset();
}

// Built with CUDA, the built-in RoPE and grouped-experts ops exist for device cuda too (their
// kernels run only where a GPU is: tests/ops/cuda/kernels_test.cpp).
TEST(OpRegistry, CudaOpsAreBuiltInWhenBuilt) {
#ifdef TITAN_HAVE_CUDA
  Registry& r = Registry::global();
  EXPECT_EQ(r.op<ops::RopeOp>("cos_sin_rope", "cuda", "float32").device, "cuda");
  for (const char* dtype : {"float32", "bfloat16"})
    EXPECT_EQ(r.op<ops::GroupedExpertsOp>("grouped_experts", "cuda", dtype).dtype, dtype);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

config::JobConfig tiny_moe(const std::string& imports) {
  config::JobConfig c = small(imports, 32);
  c.model.flavor = "debugmodel_moe";
  c.model.num_experts = 4;
  c.model.top_k = 2;
  c.model.moe_hidden_dim = 16;
  c.training.mixed_precision_param = "float32";  // compared to fp32 rounding below
  return c;
}

// The example experts plugin replaces the grouped experts of every MoE layer, agrees with the
// built-in op to fp32 rounding, and passes check-kernel against the reference loop.
TEST(Plugin, ExampleExpertsKernelReplacesEveryMoeLayer) {
  Registry::global().reset();
  const std::string lib = plugin("titan_token_experts");
  Registry::global().load(lib);
  config::JobConfig c = tiny_moe(lib);
  auto tree = qwen3::build_module_tree(qwen3::args_from_config(c), 32);
  const OverrideReport rep = apply_overrides(tree, "model", {lib});
  ASSERT_EQ(rep.replaced, 2);
  EXPECT_EQ(rep.lines[0],
            "[Override] token_experts: model.layers.0.moe.experts GroupedExperts.Config -> "
            "TokenExperts.Config");
  train::Trainer builtin(tiny_moe(""), docs());
  train::Trainer plugged(c, docs());
  for (int i = 0; i < 2; ++i) {
    train::StepResult a = builtin.step(), b = plugged.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm);
  }
  EXPECT_TRUE(tools::check_kernels(c));
  Registry::global().reset();
}

}  // namespace
}  // namespace titan::plugin
