// gemm (oneDNN matmul) against a double loop reference: all four transpose combinations,
// leading dimensions larger than the rows, and accumulate=true adding into C.
#include "titan/ops/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference_util.h"
#include "titan/core/dtype.h"

namespace titan::ops {
namespace {

using kernel_test::uniform;

struct GemmCase {
  bool ta, tb;
  int64_t M, N, K;
};

std::string case_name(const ::testing::TestParamInfo<GemmCase>& info) {
  const GemmCase& c = info.param;
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + "_" + std::to_string(c.M) + "x" +
         std::to_string(c.N) + "x" + std::to_string(c.K);
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

// Runs one gemm with padded leading dimensions (NaN in the padding of A and B, so reading
// outside the strided rows would poison C; a sentinel in C's padding, which must survive) and
// checks each C element within 1e-5 of the magnitude Σ_k |A_ik·B_kj| + |C0_ij| (fp32
// accumulation over K ≤ 65 terms is ~K·6e-8 ≈ 4e-6 of that in the worst case).
void run_case(const GemmCase& c, bool accumulate, uint32_t seed) {
  const int64_t M = c.M, N = c.N, K = c.K;
  const int64_t a_rows = c.ta ? K : M, a_cols = c.ta ? M : K, lda = a_cols + 3;
  const int64_t b_rows = c.tb ? N : K, b_cols = c.tb ? K : N, ldb = b_cols + 5;
  const int64_t ldc = N + 7;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float sentinel = 4242.0f;
  std::mt19937 g(seed);
  std::vector<float> A(a_rows * lda, nan), B(b_rows * ldb, nan), C(M * ldc, sentinel);
  auto ra = uniform(a_rows * a_cols, g, -1.f, 1.f);
  auto rb = uniform(b_rows * b_cols, g, -1.f, 1.f);
  auto rc = uniform(M * N, g, -2.f, 2.f);
  for (int64_t r = 0; r < a_rows; ++r)
    for (int64_t q = 0; q < a_cols; ++q) A[r * lda + q] = ra[r * a_cols + q];
  for (int64_t r = 0; r < b_rows; ++r)
    for (int64_t q = 0; q < b_cols; ++q) B[r * ldb + q] = rb[r * b_cols + q];
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = rc[i * N + j];  // C0 (garbage if !accumulate)
  auto a_at = [&](int64_t i, int64_t k) -> double {
    return c.ta ? A[k * lda + i] : A[i * lda + k];
  };
  auto b_at = [&](int64_t k, int64_t j) -> double {
    return c.tb ? B[j * ldb + k] : B[k * ldb + j];
  };

  gemm(c.ta, c.tb, M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, accumulate);

  double max_rel = 0;
  int bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = accumulate ? rc[i * N + j] : 0.0, mag = accumulate ? std::abs(ref) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        ref += a_at(i, k) * b_at(k, j);
        mag += std::abs(a_at(i, k) * b_at(k, j));
      }
      const double err = std::abs(C[i * ldc + j] - ref);
      max_rel = std::max(max_rel, err / mag);
      if (!(err <= 1e-5 * mag) && bad++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << C[i * ldc + j] << ", expected " << ref
                      << " (accumulate " << accumulate << ")";
    }
    for (int64_t j = N; j < ldc; ++j)
      ASSERT_EQ(C[i * ldc + j], sentinel) << "gemm wrote C padding at row " << i << " col " << j;
  }
  ::testing::Test::RecordProperty(std::string("max_rel_err acc=") + (accumulate ? "1" : "0"),
                                  kernel_test::sci(max_rel));
}

TEST_P(GemmTest, MatchesReferenceOverwrite) { run_case(GetParam(), false, 11); }

TEST_P(GemmTest, MatchesReferenceAccumulate) { run_case(GetParam(), true, 12); }

// Repeating the call with the same data gives the same result from the cached primitive, and
// accumulating twice adds twice.
TEST_P(GemmTest, CachedPrimitiveReusedAndAccumulatesAgain) {
  const GemmCase& c = GetParam();
  std::mt19937 g(13);
  const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
  auto A = uniform(c.M * c.K, g, -1.f, 1.f), B = uniform(c.K * c.N, g, -1.f, 1.f);
  std::vector<float> C1(c.M * c.N, 0.f), C2(c.M * c.N, 0.f);
  gemm(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C1.data(), c.N, false);
  const int64_t cached = gemm_cache_size();
  gemm(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C2.data(), c.N, false);
  EXPECT_EQ(gemm_cache_size(), cached);
  EXPECT_EQ(C1, C2);
  gemm(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, C2.data(), c.N, true);
  for (size_t i = 0; i < C1.size(); ++i)
    EXPECT_NEAR(C2[i], 2 * C1[i], 1e-5 * (1 + std::abs(C1[i])));
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, GemmTest,
    ::testing::Values(GemmCase{false, false, 7, 5, 9}, GemmCase{false, true, 7, 5, 9},
                      GemmCase{true, false, 7, 5, 9}, GemmCase{true, true, 7, 5, 9},
                      GemmCase{false, false, 33, 65, 47}, GemmCase{false, true, 33, 65, 47},
                      GemmCase{true, false, 33, 65, 47}, GemmCase{true, true, 33, 65, 47}),
    case_name);

// linear_fwd / linear_bwd (nn.Linear without bias): y = x·wᵀ, dx = dy·w (= or +=), dw += dyᵀ·x.
TEST(LinearTest, ForwardAndBackwardMatchReference) {
  const int64_t M = 6, in = 10, out = 7;
  std::mt19937 g(14);
  auto x = uniform(M * in, g, -1.f, 1.f), w = uniform(out * in, g, -1.f, 1.f);
  auto dy = uniform(M * out, g, -1.f, 1.f), dw0 = uniform(out * in, g, -1.f, 1.f);
  auto dx0 = uniform(M * in, g, -1.f, 1.f);
  std::vector<float> y(M * out), dx(M * in), dxa = dx0, dw = dw0;
  linear_fwd(x.data(), w.data(), y.data(), M, in, out);
  linear_bwd(dy.data(), x.data(), w.data(), dx.data(), dw.data(), M, in, out);
  linear_bwd(dy.data(), x.data(), w.data(), dxa.data(), nullptr, M, in, out, true);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double r = 0;
      for (int64_t k = 0; k < in; ++k) r += double(x[i * in + k]) * w[o * in + k];
      EXPECT_NEAR(y[i * out + o], r, 1e-5);
    }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < in; ++k) {
      double r = 0;
      for (int64_t o = 0; o < out; ++o) r += double(dy[i * out + o]) * w[o * in + k];
      EXPECT_NEAR(dx[i * in + k], r, 1e-5);
      EXPECT_NEAR(dxa[i * in + k], dx0[i * in + k] + r, 1e-5);
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      double r = dw0[o * in + k];
      for (int64_t i = 0; i < M; ++i) r += double(dy[i * out + o]) * x[i * in + k];
      EXPECT_NEAR(dw[o * in + k], r, 1e-5);
    }
}

// gemm_rows (M and K as oneDNN runtime dimensions) against the double loop reference for every
// transpose combination, both accumulate modes and many (M, K) pairs through the same fixed N and
// leading dimensions: after the first pass over the layouts no call creates a primitive, however
// M and K change. K = 0 zeroes C (overwrite) or leaves it (accumulate). Tolerance as above.
enum class RowsKind { kFp32, kBf16, kBf16Converting };

// The test below for gemm_rows, gemm_rows_bf16 and its converting fallback (in bf16 the operands
// are bf16 values, so the products are exact and the same tolerance holds).
void check_gemm_rows(RowsKind kind) {
  const int64_t N = 19, ld = 131;  // ld >= every M, N, K below, so one layout serves them all
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool bf16 = kind != RowsKind::kFp32;
  std::mt19937 g(15);
  const std::vector<int64_t> Ms = {1, 2, 7, 33, 100, 128}, Ks = {0, 1, 5, 64, 127};
  int64_t cached = -1;
  for (int pass = 0; pass < 2; ++pass) {
    for (int combo = 0; combo < 8; ++combo) {
      const bool ta = combo & 1, tb = combo & 2, acc = combo & 4;
      for (int64_t M : Ms)
        for (int64_t K : Ks) {
          // Both operands as ld-strided [128, ld] blocks with NaN outside the logical matrix.
          std::vector<float> A(128 * ld, nan), B(128 * ld, nan), C(128 * ld, 4242.f);
          auto ra = uniform(M * K, g, -1.f, 1.f), rb = uniform(K * N, g, -1.f, 1.f);
          auto rc = uniform(M * N, g, -2.f, 2.f);
          if (bf16) {
            for (float& v : ra) v = round_to_bf16(v);
            for (float& v : rb) v = round_to_bf16(v);
          }
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < K; ++k) (ta ? A[k * ld + i] : A[i * ld + k]) = ra[i * K + k];
          for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < N; ++j) (tb ? B[j * ld + k] : B[k * ld + j]) = rb[k * N + j];
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) C[i * ld + j] = rc[i * N + j];
          if (!bf16) {
            gemm_rows(ta, tb, M, N, K, A.data(), ld, B.data(), ld, C.data(), ld, acc);
          } else {
            std::vector<uint16_t> Ab(A.size()), Bb(B.size());
            f32_to(DType::BF16, A.data(), std::ssize(A), Ab.data());
            f32_to(DType::BF16, B.data(), std::ssize(B), Bb.data());
            (kind == RowsKind::kBf16 ? gemm_rows_bf16 : gemm_rows_bf16_converting)(
                ta, tb, M, N, K, Ab.data(), ld, Bb.data(), ld, C.data(), ld, acc);
          }
          int bad = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double ref = acc ? rc[i * N + j] : 0.0, mag = std::abs(ref);
              for (int64_t k = 0; k < K; ++k) {
                ref += double(ra[i * K + k]) * rb[k * N + j];
                mag += std::abs(double(ra[i * K + k]) * rb[k * N + j]);
              }
              if (!(std::abs(C[i * ld + j] - ref) <= 1e-5 * mag) && bad++ < 5)
                ADD_FAILURE() << "ta " << ta << " tb " << tb << " acc " << acc << " M " << M
                              << " K " << K << ": C[" << i << "," << j << "] = " << C[i * ld + j]
                              << ", expected " << ref;
            }
            for (int64_t j = N; j < ld; ++j) ASSERT_EQ(C[i * ld + j], 4242.f) << "C padding";
          }
          for (int64_t i = M; i < 128; ++i) ASSERT_EQ(C[i * ld], 4242.f) << "rows past M";
        }
    }
    if (pass == 0) cached = gemm_cache_size();
    EXPECT_EQ(gemm_cache_size(), cached) << "created a primitive in pass " << pass;
  }
}

TEST(GemmRowsTest, MatchesReferenceForChangingRowCountsWithBoundedCache) {
  check_gemm_rows(RowsKind::kFp32);
}
TEST(GemmRowsTest, Bf16MatchesReferenceForChangingRowCountsWithBoundedCache) {
  check_gemm_rows(RowsKind::kBf16);
}
// The fallback of CPUs without bf16 instructions, on every CPU.
TEST(GemmRowsTest, Bf16ConvertingMatchesReferenceForChangingRowCountsWithBoundedCache) {
  check_gemm_rows(RowsKind::kBf16Converting);
}

}  // namespace
}  // namespace titan::ops
