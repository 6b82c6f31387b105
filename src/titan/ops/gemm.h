// GEMM through oneDNN matmul, the one place titan multiplies matrices.
//
//   C[M,N] = op(A)[M,K] · op(B)[K,N]        (accumulate=false)
//   C[M,N] += op(A)[M,K] · op(B)[K,N]       (accumulate=true, a oneDNN sum post-op)
//
// All matrices are row-major with leading dimensions lda/ldb/ldc (elements between rows as
// stored). op(X) = X, or Xᵀ when trans_x: a transposed operand is read through strides, never
// copied. One primitive (with its memory objects and a user-managed scratchpad) is created per
// distinct (shape, layout, accumulate) and cached, so steady-state calls create nothing.
// Called from the driving thread, oneDNN parallelizes inside. Each thread has its own cache, so
// the threads of an OpenMP parallel region may each run their own products at once; oneDNN does
// not nest, so each such product runs on its calling thread alone (the grouped experts do this).
//
// Exception: a product of at most 4 rows with a transposed B (a linear layer's forward for one
// token per sequence: generation's decode) is memory bound, and oneDNN 2.6 reads B at about half
// the machine's rate there; it runs as row dot products instead (gemm.cpp gemv: fp32 sums of
// exact products in a fixed order, independent of threads), as do gemm_bf16's.
#pragma once
#include <cstdint>
#include <string>

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

// bf16 GEMM with fp32 accumulation (the GEMM of bf16 mixed-precision training: bf16 inputs,
// fp32 output and master weights). A and B hold raw bf16 bit patterns (uint16_t); C is fp32.
// Same layout, stride, transpose, accumulate and caching semantics as gemm. Runs oneDNN's bf16
// matmul when bf16_gemm_native(); otherwise gemm_bf16_converting. Either way each product of two
// bf16 values is exact in fp32 and the sum is accumulated in fp32.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

// The fallback of gemm_bf16, callable directly (tests run it on every CPU): widens op(A) and
// op(B)'s stored rows to fp32 (exact) in cached scratch buffers and runs the fp32 gemm.
void gemm_bf16_converting(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
                          int64_t ldc, bool accumulate);

// gemm_rows with bf16 inputs (fp32 output and accumulation), as gemm_bf16 is to gemm.
void gemm_rows_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
                    bool accumulate);
// Its fallback, callable directly (tests run it on every CPU): the stored rows of op(A) and op(B)
// widened to fp32 with their leading dimensions kept, then gemm_rows, so the primitive cache stays
// bounded however M and K change (as gemm_rows').
void gemm_rows_bf16_converting(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                               float* C, int64_t ldc, bool accumulate);

// Mixed-precision linear layer (torch.autocast's bf16 Linear, fp32 output): the fp32 input x is
// rounded to bf16 (nearest even, ops::to_bf16) into scratch[M·in], w[out,in] is the bf16 compute
// copy of the weight, y[M,out] = bf16(x)·wᵀ with fp32 accumulation.
void linear_fwd_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t in,
                     int64_t out, uint16_t* scratch);
// Backward of linear_fwd_bf16 (the GEMMs of autocast's backward, inputs rounded to bf16):
//   dx[M,in] (=, or += when dx_accumulate) bf16(dy)·w;   dw[out,in] (fp32) += bf16(dy)ᵀ·bf16(x).
// scratch: M·(in + out) bf16 values.
void linear_bwd_bf16(const float* dy, const float* x, const uint16_t* w, float* dx, float* dw,
                     int64_t M, int64_t in, int64_t out, bool dx_accumulate, uint16_t* scratch);

// Whether gemm_bf16 runs oneDNN's bf16 matmul: the CPU (as oneDNN sees it, ONEDNN_MAX_CPU_ISA
// included) has AVX512-BF16 or AMX and oneDNN creates the primitive. oneDNN 2.6 refuses bf16
// matmul on AVX2 and emulates it slowly on plain AVX512; there the converting path runs instead.
// Probed once, cached.
bool bf16_gemm_native();

// The implementation oneDNN picks for a 2048³ matmul (primitive_desc::impl_info_str(), e.g.
// "brg:avx512_core_amx"), fp32 or bf16 inputs; for bf16 without native support,
// "bf16->f32 convert + " followed by the fp32 name. Log-worthy at startup.
std::string gemm_isa(bool bf16);

// Number of cached primitives, of gemm and gemm_rows together, over all threads (for tests and
// diagnostics).
int64_t gemm_cache_size();

}  // namespace titan::ops

namespace titan::ops {
// Measures fp32 GEMM throughput (FLOP/s) of oneDNN on this machine with n×n×n products, best of
// `reps`: the roofline that MFU and the benchmarks are stated against.
double gemm_probe_flops(int64_t n = 2048, int reps = 3);
// The same probe for gemm_bf16 (bf16 inputs, fp32 output and accumulation); more repetitions,
// as the AMX/AVX512-BF16 rate varies more from call to call (frequency) than the fp32 one.
double gemm_probe_flops_bf16(int64_t n = 2048, int reps = 10);
}  // namespace titan::ops
