// gemm_bf16 (bf16 inputs, fp32 output and accumulation) against an fp64 reference computed from
// the same bf16 values: all four transpose combinations, odd shapes, leading dimensions larger
// than the width, accumulate on and off; for the dispatching gemm_bf16 (oneDNN's bf16 matmul where
// bf16_gemm_native(), else the converting path) and for gemm_bf16_converting directly, so the
// fallback is tested on every CPU.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "reference_util.h"
#include "titan/core/dtype.h"
#include "titan/ops/gemm.h"

namespace titan::ops {
namespace {

using kernel_test::uniform;

struct Bf16Case {
  bool ta, tb;
  int64_t M, N, K;
};

std::string case_name(const ::testing::TestParamInfo<Bf16Case>& info) {
  const Bf16Case& c = info.param;
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + "_" + std::to_string(c.M) + "x" +
         std::to_string(c.N) + "x" + std::to_string(c.K);
}

constexpr uint16_t kBf16NaN = 0x7FC0;

uint16_t to_bf16(float x) {
  uint16_t h;
  f32_to(DType::BF16, &x, 1, &h);
  return h;
}
double from_bf16(uint16_t h) {
  float f;
  to_f32(DType::BF16, &h, 1, &f);
  return f;
}

class GemmBf16Test : public ::testing::TestWithParam<Bf16Case> {};

// One call with padded leading dimensions (bf16 NaN in the padding of A and B, so reading outside
// the strided rows would poison C; a sentinel in C's padding, which must survive).
//
// Tolerance: the inputs are bf16 values, exactly representable in fp32, and each product a·b of
// two bf16 values (8-bit significands) is exact in fp32 (16 bits ≤ 24), so the only error is
// the fp32 accumulation of K products plus C0: at most (K+1)·u·Σ(|a||b|) + |C0|) to first order
// with u = 2^-24, in any summation order (blocked, pairwise, AMX dot products). We allow
// |err| ≤ 2·(K+1)·FLT_EPSILON·(Σ_k |a_ik·b_kj| + |C0_ij|), i.e. 4x that bound, per element.
void run_case(const Bf16Case& c, bool accumulate, uint32_t seed, bool converting) {
  const int64_t M = c.M, N = c.N, K = c.K;
  const int64_t a_rows = c.ta ? K : M, a_cols = c.ta ? M : K, lda = a_cols + 3;
  const int64_t b_rows = c.tb ? N : K, b_cols = c.tb ? K : N, ldb = b_cols + 5;
  const int64_t ldc = N + 7;
  const float sentinel = 4242.0f;
  std::mt19937 g(seed);
  std::vector<uint16_t> A(a_rows * lda, kBf16NaN), B(b_rows * ldb, kBf16NaN);
  std::vector<float> C(M * ldc, sentinel);
  auto ra = uniform(a_rows * a_cols, g, -1.f, 1.f);
  auto rb = uniform(b_rows * b_cols, g, -1.f, 1.f);
  auto rc = uniform(M * N, g, -2.f, 2.f);
  for (int64_t r = 0; r < a_rows; ++r)
    for (int64_t q = 0; q < a_cols; ++q) A[r * lda + q] = to_bf16(ra[r * a_cols + q]);
  for (int64_t r = 0; r < b_rows; ++r)
    for (int64_t q = 0; q < b_cols; ++q) B[r * ldb + q] = to_bf16(rb[r * b_cols + q]);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = rc[i * N + j];  // C0 (garbage if !accumulate)
  // The logical op(A), op(B) as doubles, read back from the bf16 operands.
  std::vector<double> a(M * K), b(K * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      a[i * K + k] = from_bf16(c.ta ? A[k * lda + i] : A[i * lda + k]);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j)
      b[k * N + j] = from_bf16(c.tb ? B[j * ldb + k] : B[k * ldb + j]);

  (converting ? gemm_bf16_converting : gemm_bf16)(c.ta, c.tb, M, N, K, A.data(), lda, B.data(), ldb,
                                                  C.data(), ldc, accumulate);

  double max_rel = 0;
  int bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = accumulate ? rc[i * N + j] : 0.0, mag = accumulate ? std::abs(ref) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        ref += a[i * K + k] * b[k * N + j];
        mag += std::abs(a[i * K + k] * b[k * N + j]);
      }
      const double err = std::abs(C[i * ldc + j] - ref);
      const double tol = 2.0 * static_cast<double>(K + 1) * FLT_EPSILON * mag;
      max_rel = std::max(max_rel, mag > 0 ? err / mag : err);
      if (!(err <= tol) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << C[i * ldc + j] << ", expected " << ref
                      << " (err " << err << " > tol " << tol << ", accumulate " << accumulate
                      << ", converting " << converting << ")";
    }
    for (int64_t j = N; j < ldc; ++j)
      ASSERT_EQ(C[i * ldc + j], sentinel) << "gemm_bf16 wrote C padding at row " << i;
  }
  ::testing::Test::RecordProperty(std::string("max_rel_err acc=") + (accumulate ? "1" : "0") +
                                      " conv=" + (converting ? "1" : "0"),
                                  kernel_test::sci(max_rel));
}

TEST_P(GemmBf16Test, MatchesReferenceOverwrite) { run_case(GetParam(), false, 21, false); }
TEST_P(GemmBf16Test, MatchesReferenceAccumulate) { run_case(GetParam(), true, 22, false); }
TEST_P(GemmBf16Test, ConvertingMatchesReferenceOverwrite) { run_case(GetParam(), false, 23, true); }
TEST_P(GemmBf16Test, ConvertingMatchesReferenceAccumulate) { run_case(GetParam(), true, 24, true); }

// The same call twice gives the same result from the cached primitive (no new one), and
// accumulating adds again.
TEST_P(GemmBf16Test, CachedPrimitiveReusedAndAccumulatesAgain) {
  const Bf16Case& c = GetParam();
  std::mt19937 g(25);
  const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
  auto af = uniform(c.M * c.K, g, -1.f, 1.f), bf = uniform(c.K * c.N, g, -1.f, 1.f);
  std::vector<uint16_t> A(af.size()), B(bf.size());
  f32_to(DType::BF16, af.data(), static_cast<int64_t>(af.size()), A.data());
  f32_to(DType::BF16, bf.data(), static_cast<int64_t>(bf.size()), B.data());
  std::vector<float> C1(c.M * c.N, 0.f), C2(c.M * c.N, 0.f);
  gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C1.data(), c.N, false);
  const int64_t cached = gemm_cache_size();
  gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C2.data(), c.N, false);
  EXPECT_EQ(gemm_cache_size(), cached);
  EXPECT_EQ(C1, C2);
  gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C2.data(), c.N, true);
  for (size_t i = 0; i < C1.size(); ++i)
    EXPECT_NEAR(C2[i], 2 * C1[i], 1e-5 * (1 + std::abs(C1[i])));
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, GemmBf16Test,
    ::testing::Values(Bf16Case{false, false, 7, 5, 9}, Bf16Case{false, true, 7, 5, 9},
                      Bf16Case{true, false, 7, 5, 9}, Bf16Case{true, true, 7, 5, 9},
                      Bf16Case{false, false, 37, 129, 65}, Bf16Case{false, true, 37, 129, 65},
                      Bf16Case{true, false, 37, 129, 65}, Bf16Case{true, true, 37, 129, 65}),
    case_name);

// K = 0: overwrite zeroes C, accumulate leaves it (both paths).
TEST(GemmBf16, EmptyReductionZeroesOrKeeps) {
  for (bool converting : {false, true}) {
    std::vector<float> C = {1.f, 2.f, 3.f, 4.f};
    const uint16_t dummy = 0;
    auto f = converting ? gemm_bf16_converting : gemm_bf16;
    f(false, false, 2, 2, 0, &dummy, 1, &dummy, 2, C.data(), 2, true);
    EXPECT_EQ(C, (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
    f(false, false, 2, 2, 0, &dummy, 1, &dummy, 2, C.data(), 2, false);
    EXPECT_EQ(C, (std::vector<float>(4, 0.f)));
  }
}

// The ISA names are non-empty, and a non-native CPU reports the converting path.
TEST(GemmBf16, IsaNames) {
  const std::string f32 = gemm_isa(false), bf16 = gemm_isa(true);
  EXPECT_FALSE(f32.empty());
  EXPECT_FALSE(bf16.empty());
  if (!bf16_gemm_native()) {
    EXPECT_EQ(bf16.rfind("bf16->f32 convert + ", 0), 0u) << bf16;
  }
  ::testing::Test::RecordProperty("isa_fp32", f32);
  ::testing::Test::RecordProperty("isa_bf16", bf16);
  std::printf("gemm ISA: fp32 %s, bf16 %s (native %d)\n", f32.c_str(), bf16.c_str(),
              static_cast<int>(bf16_gemm_native()));
}

// Products of at most 4 rows against a transposed B (generation's decode, one row per sequence)
// run as row dot products, not oneDNN: each row's result is bitwise the same whether it is
// multiplied alone or with up to 3 others (a prompt decodes the same alone and in a batch), and
// matches the double reference; fp32 and bf16, K with a tail past the 16-lanes blocks.
TEST(GemmFewRowsTest, EachRowAsAloneAndMatchesReference) {
  std::mt19937 g(31);
  const int64_t N = 37, K = 211;
  const std::vector<float> a = uniform(4 * K, g, -1.f, 1.f), b = uniform(N * K, g, -1.f, 1.f);
  std::vector<uint16_t> ab(a.size()), bb(b.size());
  f32_to(DType::BF16, a.data(), std::ssize(a), ab.data());
  f32_to(DType::BF16, b.data(), std::ssize(b), bb.data());
  std::vector<float> ar(a.size()), br(b.size());  // the bf16 values, widened
  to_f32(DType::BF16, ab.data(), std::ssize(ab), ar.data());
  to_f32(DType::BF16, bb.data(), std::ssize(bb), br.data());
  for (const bool bf16 : {false, true}) {
    auto run = [&](int64_t M, int64_t first) {
      std::vector<float> c(M * N);
      if (bf16)
        gemm_bf16(false, true, M, N, K, ab.data() + first * K, K, bb.data(), K, c.data(), N, false);
      else
        gemm(false, true, M, N, K, a.data() + first * K, K, b.data(), K, c.data(), N, false);
      return c;
    };
    for (int64_t M = 1; M <= 4; ++M) {
      const std::vector<float> c = run(M, 0);
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<float> alone = run(1, m);
        for (int64_t n = 0; n < N; ++n) {
          ASSERT_EQ(c[m * N + n], alone[n]) << (bf16 ? "bf16" : "fp32") << " M=" << M;
          double want = 0;
          for (int64_t k = 0; k < K; ++k)
            want += bf16 ? static_cast<double>(ar[m * K + k]) * br[n * K + k]
                         : static_cast<double>(a[m * K + k]) * b[n * K + k];
          ASSERT_NEAR(c[m * N + n], want, 1e-4) << (bf16 ? "bf16" : "fp32") << " M=" << M;
        }
      }
    }
  }
}

}  // namespace
}  // namespace titan::ops
