// GEMM through oneDNN matmul, the one place titan multiplies matrices.
//
//   C[M,N] = op(A)[M,K] · op(B)[K,N]        (accumulate=false)
//   C[M,N] += op(A)[M,K] · op(B)[K,N]       (accumulate=true, a oneDNN sum post-op)
//
// All matrices are row-major with leading dimensions lda/ldb/ldc (elements between rows as
// stored). op(X) = X, or Xᵀ when trans_x: a transposed operand is read through strides, never
// copied. One primitive (with its memory objects and a user-managed scratchpad) is created per
// distinct (shape, layout, accumulate) and cached, so steady-state calls create nothing.
// Not thread-safe: call from the driving thread; oneDNN parallelizes inside.
#pragma once
#include <cstdint>

namespace titan::ops {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

// gemm for products whose row count or reduction length changes from call to call (the token
// groups of MoE experts): M and K are oneDNN runtime dimensions, so one primitive per (layout,
// N, lda, ldb, ldc, accumulate) serves every M and K and the cache stays bounded however the
// tokens are routed. Same semantics as gemm; K = 0 leaves C (accumulate) or zeroes it.
void gemm_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

// Linear layer y[M,out] = x[M,in] · w[out,in]ᵀ (PyTorch nn.Linear, no bias).
inline void linear_fwd(const float* x, const float* w, float* y, int64_t M, int64_t in,
                       int64_t out) {
  gemm(false, true, M, out, in, x, in, w, in, y, out, false);
}

// Backward of linear_fwd: dx[M,in] (=, or += when dx_accumulate) dy·w;  dw[out,in] += dyᵀ·x.
inline void linear_bwd(const float* dy, const float* x, const float* w, float* dx, float* dw,
                       int64_t M, int64_t in, int64_t out, bool dx_accumulate = false) {
  if (dx) gemm(false, false, M, in, out, dy, out, w, in, dx, in, dx_accumulate);
  if (dw) gemm(true, false, out, in, M, dy, out, x, in, dw, in, true);
}

// Number of cached primitives, of gemm and gemm_rows together (for tests and diagnostics).
int64_t gemm_cache_size();

}  // namespace titan::ops

namespace titan::ops {
// Measures fp32 GEMM throughput (FLOP/s) of oneDNN on this machine with n×n×n products, best of
// `reps`: the roofline that MFU and the benchmarks are stated against.
double gemm_probe_flops(int64_t n = 2048, int reps = 3);
}  // namespace titan::ops
