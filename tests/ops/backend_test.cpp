// The backend table (ops/backend.h): the built-in CPU fp32 backend is found and complete, a
// missing (device, dtype) names what exists, registration rejects incomplete tables and
// duplicates; and the ops that replaced the model's host-side loops (first_bad_position,
// router_aux_stats, expert_bias_update) against values worked out by hand.
#include "titan/ops/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/error.h"

namespace titan::ops {
namespace {

// The new ops are called through the table, as the model calls them.
const Backend& cpu() { return backend("cpu", "float32"); }

TEST(BackendTest, CpuFloat32IsBuiltInAndComplete) {
  const Backend& b = backend("cpu", "float32");
  EXPECT_EQ(b.device, "cpu");
  EXPECT_EQ(b.dtype, "float32");
  EXPECT_TRUE(b.missing().empty());
  // Every member, spelled out (independent of missing()).
  EXPECT_NE(b.alloc, nullptr);
  EXPECT_NE(b.free, nullptr);
  EXPECT_NE(b.copy, nullptr);
  EXPECT_NE(b.memset, nullptr);
  EXPECT_NE(b.embedding_fwd, nullptr);
  EXPECT_NE(b.embedding_bwd, nullptr);
  EXPECT_NE(b.rmsnorm_fwd, nullptr);
  EXPECT_NE(b.rmsnorm_bwd, nullptr);
  EXPECT_NE(b.rope_table, nullptr);
  EXPECT_NE(b.first_bad_position, nullptr);
  EXPECT_NE(b.swiglu_fwd, nullptr);
  EXPECT_NE(b.swiglu_bwd, nullptr);
  EXPECT_NE(b.add, nullptr);
  EXPECT_NE(b.add_inplace, nullptr);
  EXPECT_NE(b.linear_fwd, nullptr);
  EXPECT_NE(b.linear_bwd, nullptr);
  EXPECT_NE(b.attention_segments, nullptr);
  EXPECT_NE(b.attention_fwd, nullptr);
  EXPECT_NE(b.attention_bwd, nullptr);
  EXPECT_NE(b.lm_head_ce, nullptr);
  EXPECT_NE(b.router_fwd, nullptr);
  EXPECT_NE(b.router_bwd, nullptr);
  EXPECT_NE(b.topk_rows, nullptr);
  EXPECT_NE(b.count_experts, nullptr);
  EXPECT_NE(b.router_aux_stats, nullptr);
  EXPECT_NE(b.expert_bias_update, nullptr);
  // The CPU backend's kernels are the op functions themselves.
  EXPECT_EQ(b.attention_fwd, &ops::attention_fwd);
  EXPECT_EQ(b.router_fwd, &ops::router_fwd);
  // The same table on every lookup.
  EXPECT_EQ(&backend("cpu", "float32"), &b);
}

TEST(BackendTest, CpuMemoryEntryPoints) {
  const Backend& b = backend("cpu", "float32");
  auto* p = static_cast<float*>(b.alloc(5 * sizeof(float)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  b.memset(p, 0, 5 * sizeof(float));
  const float src[3] = {1.5f, -2.f, 3.25f};
  b.copy(p + 1, src, sizeof src);
  EXPECT_EQ(p[0], 0.f);
  EXPECT_EQ(p[1], 1.5f);
  EXPECT_EQ(p[2], -2.f);
  EXPECT_EQ(p[3], 3.25f);
  EXPECT_EQ(p[4], 0.f);
  b.free(p);
}

// reserve/commit/decommit are optional, but a table has all three or none.
TEST(BackendTest, ReserveCommitDecommitComeTogether) {
  Backend b = backend("cpu", "float32");
  EXPECT_EQ(b.reserve, nullptr);
  EXPECT_TRUE(b.memory().host());
  b.reserve = b.alloc;
  EXPECT_EQ(b.missing(), (std::vector<std::string>{"commit", "decommit"}));
}

TEST(BackendTest, MissingPairNamesWhatIsRegistered) {
  try {
    backend("rocm", "bfloat16");
    FAIL() << "expected titan::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no backend for rocm/bfloat16; registered: "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu/float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backend("cpu", "float16"), Error);
}

// Built with CUDA (CMake found nvcc), the cuda tables are registered and complete; their kernels
// run only where a GPU is (tests/ops/cuda/kernels_test.cpp).
TEST(BackendTest, CudaTablesAreCompleteWhenBuilt) {
  const auto names = registered_backends();
  const bool have = std::find(names.begin(), names.end(), "cuda/float32") != names.end();
#ifdef TITAN_HAVE_CUDA
  ASSERT_TRUE(have);
  for (const char* dtype : {"float32", "bfloat16"}) {
    const Backend& b = backend("cuda", dtype);
    EXPECT_TRUE(b.missing().empty()) << dtype;
    EXPECT_NE(b.attention_fwd, backend("cpu", dtype).attention_fwd) << dtype;
  }
  EXPECT_NE(backend("cuda", "bfloat16").attention_fwd, backend("cuda", "float32").attention_fwd);
#else
  EXPECT_FALSE(have);
#endif
}

// The mixed-precision table is built in and complete; an fp32 table need not have its members.
TEST(BackendTest, CpuBfloat16TableIsComplete) {
  const Backend& b = backend("cpu", "bfloat16");
  EXPECT_TRUE(b.missing().empty());
  EXPECT_NE(b.linear_fwd_bf16, nullptr);
  Backend f = cpu_backend();
  EXPECT_TRUE(f.missing().empty());
  f.dtype = "bfloat16";
  EXPECT_EQ(f.missing(), (std::vector<std::string>{"to_bf16", "from_bf16", "linear_fwd_bf16",
                                                   "linear_bwd_bf16", "lm_head_ce_bf16"}));
}

TEST(BackendTest, RegisterRejectsIncompleteAndDuplicate) {
  Backend b = cpu_backend();
  b.device = "test_device";
  b.attention_bwd = nullptr;
  b.free = nullptr;
  try {
    register_backend(b);
    FAIL() << "expected titan::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_device/float32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free, attention_bwd"), std::string::npos) << e.what();
  }
  EXPECT_THROW(register_backend(cpu_backend()), Error);  // cpu/float32 is taken

  Backend ok = cpu_backend();
  ok.device = "test_device";
  const auto before = registered_backends();  // registrations last for the process (repeats)
  if (std::find(before.begin(), before.end(), "test_device/float32") == before.end())
    register_backend(ok);
  EXPECT_THROW(register_backend(ok), Error);
  EXPECT_EQ(backend("test_device", "float32").device, "test_device");
  const auto names = registered_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_device/float32"), names.end());
}

TEST(BackendOpsTest, FirstBadPosition) {
  const std::vector<int32_t> good = {0, 1, 2, 3, 0, 1};
  EXPECT_EQ(cpu().first_bad_position(good.data(), 6, 4), -1);
  EXPECT_EQ(cpu().first_bad_position(good.data(), 0, 4), -1);
  const std::vector<int32_t> high = {0, 1, 4, -1};
  EXPECT_EQ(cpu().first_bad_position(high.data(), 4, 4), 2);  // the first of two bad ones
  const std::vector<int32_t> low = {0, -1, 7};
  EXPECT_EQ(cpu().first_bad_position(low.data(), 3, 8), 1);
  EXPECT_EQ(cpu().first_bad_position(low.data(), 3, 7), 1);
}

// hits[e] += (t, j) pairs routed to e; psum[e] += Σ_t p[t, e]; both accumulate.
TEST(BackendOpsTest, RouterAuxStatsAccumulates) {
  const int64_t T = 3, E = 4, K = 2;
  const std::vector<float> p = {0.5f,  0.25f, 0.125f, 0.125f,  //
                                0.25f, 0.25f, 0.25f,  0.25f,   //
                                0.0f,  0.0f,  0.75f,  0.25f};
  const std::vector<int32_t> idx = {0, 1, 0, 3, 2, 3};
  std::vector<double> hits = {1, 0, 0, 0}, psum = {0, 0, 0, 1};
  cpu().router_aux_stats(p.data(), idx.data(), T, E, K, hits.data(), psum.data());
  EXPECT_EQ(hits, (std::vector<double>{3, 1, 1, 2}));
  EXPECT_EQ(psum, (std::vector<double>{0.75, 0.5, 1.125, 1.625}));
}

// bias += coeff·sign(mean(load) − load), centred to mean 0.
TEST(BackendOpsTest, ExpertBiasUpdate) {
  const std::vector<double> load = {1, 2, 3, 6};  // mean 3: signs +1, +1, 0, -1
  std::vector<float> bias = {1, 2, 3, 4};
  cpu().expert_bias_update(load.data(), 4, 0.5, bias.data());
  // delta = {0.5, 0.5, 0, -0.5}, mean(delta) = 0.125
  EXPECT_EQ(bias, (std::vector<float>{1.375f, 2.375f, 2.875f, 3.375f}));

  const std::vector<double> even = {5, 5, 5};  // balanced: nothing moves
  std::vector<float> b2 = {0.25f, -1.f, 2.f};
  cpu().expert_bias_update(even.data(), 3, 0.001, b2.data());
  EXPECT_EQ(b2, (std::vector<float>{0.25f, -1.f, 2.f}));
}

}  // namespace
}  // namespace titan::ops
