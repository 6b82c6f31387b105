// GEMM on the GPU through cuBLASLt (ops/cuda/cuda_ops.h), gemm.h's contract:
//   C[M,N] = op(A)[M,K] · op(B)[K,N]   (accumulate: C +=), row-major with leading dimensions.
// cuBLASLt is column-major: a row-major X is the column-major Xᵀ with the same leading
// dimension, so C = op(A)·op(B) runs as Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ with the operands swapped and the
// transposes kept. fp32: CUBLAS_COMPUTE_32F (fp32 products and sums, no TF32 rounding of the
// inputs); bf16: bf16 A and B, fp32 C and accumulation, as the CPU's gemm_bf16.
// One matmul descriptor, layouts and heuristic algorithm per distinct call shape and operand
// alignment, cached (at most kMaxPlans: an expert's token count changes every step, so a long MoE
// run meets thousands of shapes; a full cache is emptied and refilled, and the heuristic picks
// the same algorithm for a shape again); one 32 MiB workspace. (cuBLASLt's heuristic assumes
// 256-byte-aligned operands unless told otherwise, and an expert's rows or a loss chunk start
// anywhere: each call's pointer alignments, up to 256 bytes, are part of the plan's key and
// preferences.)
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <tuple>

#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt: ") + what + " failed: cublasStatus_t " +
                std::to_string(static_cast<int>(s)));
}
#define TITAN_LT_CHECK(call) check_lt((call), #call)

constexpr size_t kWorkspace = size_t{32} << 20;
constexpr size_t kMaxPlans = 4096;

// The largest power of two, at most 256, that divides p's address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

class Lt {
 public:
  static Lt& get() {
    static Lt lt;
    return lt;
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  // The plan of one call shape (operands already swapped to the column-major view).
  // align: the alignments of a, b and c (c is also d).
  const Plan& plan(bool bf16, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                   int64_t ldb, int64_t ldc, const std::array<uint32_t, 3>& align) {
    const auto key = std::make_tuple(bf16, ta, tb, m, n, k, lda, ldb, ldc, align);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= kMaxPlans) clear();
    Plan p;
    TITAN_LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    TITAN_LT_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    TITAN_LT_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    // Stored (pre-transpose) shapes, column-major.
    TITAN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, ta ? k : m, ta ? m : k, lda));
    TITAN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, tb ? n : k, tb ? k : n, ldb));
    TITAN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    TITAN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    TITAN_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t mins[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      TITAN_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, mins[i], &align[i < 3 ? i : 2],
                                                          sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
    check(found > 0, "cuBLASLt has no algorithm for a " + std::string(bf16 ? "bf16" : "fp32") +
                         " GEMM of " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k));
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

 private:
  Lt() {
    TITAN_LT_CHECK(cublasLtCreate(&handle_));
    TITAN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspace));
  }
  // Destroys every plan (host-side descriptors: matmuls already queued keep what they read).
  void clear() {
    for (auto& [key, p] : plans_) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    plans_.clear();
  }
  // Lives for the process (the driver may be gone at exit: nothing is destroyed).
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::tuple<bool, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      std::array<uint32_t, 3>>,
           Plan>
      plans_;
};

void matmul(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
            int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: C stays (accumulate) or becomes zero
    if (!accumulate)
      TITAN_CUDA_CHECK(cudaMemset2DAsync(C, static_cast<size_t>(ldc) * sizeof(float), 0,
                                         static_cast<size_t>(N) * sizeof(float),
                                         static_cast<size_t>(M), stream()));
    return;
  }
  Lt& lt = Lt::get();
  // Cᵀ[N,M] = op(B)ᵀ[N,K] · op(A)ᵀ[K,M]: cuBLASLt's A is our B, its B our A.
  const Plan& p = lt.plan(bf16, trans_b, trans_a, N, M, K, ldb, lda, ldc,
                          {alignment(B), alignment(A), alignment(C)});
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  TITAN_LT_CHECK(cublasLtMatmul(lt.handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c,
                                &p.algo, lt.workspace(), kWorkspace, stream()));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  matmul(false, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
               bool accumulate) {
  matmul(true, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void linear_fwd(const float* x, const float* w, float* y, int64_t M, int64_t in, int64_t out) {
  gemm(false, true, M, out, in, x, in, w, in, y, out, false);
}

void linear_bwd(const float* dy, const float* x, const float* w, float* dx, float* dw, int64_t M,
                int64_t in, int64_t out, bool dx_accumulate) {
  if (dx) gemm(false, false, M, in, out, dy, out, w, in, dx, in, dx_accumulate);
  if (dw) gemm(true, false, out, in, M, dy, out, x, in, dw, in, true);
}

void linear_fwd_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t in,
                     int64_t out, uint16_t* scratch) {
  to_bf16(x, M * in, scratch);
  gemm_bf16(false, true, M, out, in, scratch, in, w, in, y, out, false);
}

void linear_bwd_bf16(const float* dy, const float* x, const uint16_t* w, float* dx, float* dw,
                     int64_t M, int64_t in, int64_t out, bool dx_accumulate, uint16_t* scratch) {
  uint16_t* dy16 = scratch;           // [M, out]
  uint16_t* x16 = scratch + M * out;  // [M, in]
  to_bf16(dy, M * out, dy16);
  if (dx) gemm_bf16(false, false, M, in, out, dy16, out, w, in, dx, in, dx_accumulate);
  if (dw) {
    to_bf16(x, M * in, x16);
    gemm_bf16(true, false, out, in, M, dy16, out, x16, in, dw, in, true);
  }
}

}  // namespace titan::ops::cuda

namespace titan::ops::cuda {

double gemm_probe_flops(bool bf16, int64_t n) {
  const size_t nn = static_cast<size_t>(n) * static_cast<size_t>(n);
  const size_t in_bytes = nn * (bf16 ? 2 : 4);
  Temp<uint8_t> a(static_cast<int64_t>(in_bytes)), b(static_cast<int64_t>(in_bytes));
  Temp<float> c(static_cast<int64_t>(nn));
  TITAN_CUDA_CHECK(cudaMemsetAsync(a.get(), 0, in_bytes, stream()));
  TITAN_CUDA_CHECK(cudaMemsetAsync(b.get(), 0, in_bytes, stream()));
  auto run = [&] {
    if (bf16)
      gemm_bf16(false, false, n, n, n, reinterpret_cast<const uint16_t*>(a.get()), n,
                reinterpret_cast<const uint16_t*>(b.get()), n, c.get(), n, false);
    else
      gemm(false, false, n, n, n, reinterpret_cast<const float*>(a.get()), n,
           reinterpret_cast<const float*>(b.get()), n, c.get(), n, false);
  };
  run();
  synchronize();
  cudaEvent_t t0, t1;
  TITAN_CUDA_CHECK(cudaEventCreate(&t0));
  TITAN_CUDA_CHECK(cudaEventCreate(&t1));
  float best_ms = 1e30f;
  for (int r = 0; r < 5; ++r) {
    TITAN_CUDA_CHECK(cudaEventRecord(t0, stream()));
    for (int i = 0; i < 5; ++i) run();
    TITAN_CUDA_CHECK(cudaEventRecord(t1, stream()));
    TITAN_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    TITAN_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best_ms = std::min(best_ms, ms / 5);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         (static_cast<double>(best_ms) * 1e-3);
}

}  // namespace titan::ops::cuda
