// The backend table (ops/backend.h): the built-in CPU fp32 backend is found and complete, a
// missing (device, dtype) names what exists, registration rejects incomplete tables and
// duplicates.
#include "titan/ops/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/error.h"

namespace titan::ops {
namespace {

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

TEST(BackendTest, MissingPairNamesWhatIsRegistered) {
  try {
    backend("cuda", "bfloat16");
    FAIL() << "expected titan::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no backend for cuda/bfloat16; registered: "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu/float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backend("cpu", "bfloat16"), Error);
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

}  // namespace
}  // namespace titan::ops
