// titan's CPU ops on NVIDIA GPUs (the "cuda" device of ops/backend.h): each function has the
// signature and the semantics of the CPU op of the same name (elementwise.h, gemm.h), its
// pointers pointing to device memory (the optimizer's: optim/cuda/adamw.h). Kernels run in order on
// one stream; results are read after copy() (which waits for them) or synchronize().
//
// Built when CMake finds nvcc (option TITAN_CUDA), for Hopper (sm_90a) with a PTX fallback;
// this header names no CUDA type, so callers compile without the toolkit. Every CUDA or cuBLAS
// error becomes a titan::Error naming the call.
//
// Numerics against the CPU ops (tests/ops/cuda/kernels_test.cpp states the tolerances):
//   embedding_bwd, rmsnorm_bwd's weight gradient: the same summation order as the CPU (rows in
//     token order; 32 fixed row blocks, then the blocks in order): deterministic, no atomics;
//   gemm: cuBLASLt with CUBLAS_COMPUTE_32F (fp32 products and sums, no TF32), gemm_bf16 with bf16
//     inputs and fp32 accumulation; the order of the sums is cuBLAS's, not oneDNN's;
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "titan/ops/attention.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/loss.h"
#include "titan/ops/rope_op.h"
#include "titan/ops/router.h"

namespace titan::ops {
struct Backend;
}

namespace titan::ops::cuda {

// The backend table (ops/backend.h) of these kernels for cuda/float32 or, bf16, cuda/bfloat16
// (ops/cuda/backend.cu); builtins.cpp registers both.
Backend backend(bool bf16);

// ---- device and memory
// The number of visible GPUs; 0 with *why saying why (no driver, no device: CUDA's message).
int device_count(std::string* why);
// Makes GPU index % (visible GPUs) this process's device (cudaSetDevice), before any allocation.
void set_device(int index);
// "NVIDIA H200, sm_90, 139.8 GiB" for the current device (", device 3" when there are several).
std::string describe_device();
// cudaMalloc: 256-byte aligned, uninitialized; out of memory is a titan::Error saying how much
// was asked and is free.
void* alloc(size_t bytes);
void free(void* p);  // of alloc's or reserve's pointers; never throws
// core/device.h's optional trio, over CUDA's virtual memory management (the driver's cuMem*
// calls, found at run time through cudaGetDriverEntryPointByVersion, so nothing links libcuda):
// reserve: cuMemAddressReserve of whole granules (the device's recommended granularity, 2 MiB on
// current GPUs); commit: cuMemCreate + cuMemMap + cuMemSetAccess of each granule that lacks
// memory, zeroed in stream order; decommit: zeroes the partial granules at either end where
// mapped and retires the whole granules: unmapped and released once an event recorded after
// the kernels queued so far (which may still use them) has passed, checked at each later call,
// or taken back by a commit before that (zeroed in stream order). Out of memory in commit first
// waits for the retiring granules, then is the titan::Error alloc's is.
void* reserve(size_t bytes);
void commit(void* p, size_t bytes);
void decommit(void* p, size_t bytes);
// The current device's memory: total and in use (cudaMemGetInfo), bytes.
void memory_info(int64_t* total, int64_t* used);
// cuBLASLt's GEMM rate at n³ (bf16 inputs with fp32 accumulation, or fp32), FLOP/s: best of 5
// timed rounds of 5 after a warm-up (ops/cuda/gemm.cu).
double gemm_probe_flops(bool bf16, int64_t n = 8192);
void copy(void* dst, const void* src, size_t bytes);  // either side host or device; waits
void memset(void* dst, int value, size_t bytes);
void synchronize();  // waits for every kernel launched; throws titan::Error on a device fault

// ---- elementwise.h (ids and positions: device int32 arrays)
// embedding_fwd checks the ids on the device and throws titan::Error as the CPU op does (one
// device-to-host read of the first bad position).
void embedding_fwd(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t D,
                   float* out);
void embedding_fwd_range(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t v0,
                         int64_t vl, int64_t D, float* out);
void embedding_bwd_range(const int32_t* ids, int64_t T, const float* dout, int64_t v0, int64_t vl,
                         int64_t D, float* dtable);
void embedding_bwd(const int32_t* ids, int64_t T, const float* dout, int64_t D, float* dtable);
void rmsnorm_fwd(const NormRows& s, const float* x, const float* w, float eps, float* y,
                 float* rstd);
// scratch: ops::rmsnorm_bwd_scratch(s) floats of device memory, as on the CPU.
void rmsnorm_bwd(const NormRows& s, const float* dy, const float* x, const float* w,
                 const float* rstd, float* dx, float* dw, float* scratch);
// cos_sin[max_pos, d]: the CPU's table to the bit (rope_table_host, then copied to the device).
void rope_table(int64_t max_pos, int64_t d, double theta, float* cos_sin);
// The first t with pos[t] outside [0, limit), or −1 (read back to the host).
int64_t first_bad_position(const int32_t* pos, int64_t n, int64_t limit);
void rope_fwd(float* x, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin);
void rope_bwd(float* dx, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin);
// The "cos_sin_rope" RoPE op under device cuda (rope_fwd/rope_bwd); registered by builtins.cpp.
RopeOp cos_sin_rope_op();
void swiglu_fwd(const float* ab, float* g, int64_t T, int64_t F);
void swiglu_bwd(const float* dg, const float* ab, float* dab, int64_t T, int64_t F);
void add(const float* a, const float* b, float* out, int64_t n);
void add_inplace(float* y, const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);
void copy_rows(const float* src, int64_t src_stride, const int32_t* src_row, float* dst,
               int64_t dst_stride, const int32_t* dst_row, int64_t n, int64_t width);
void sum_rows(const float* src, int64_t src_stride, const int32_t* index, int64_t k, float* dst,
              int64_t n, int64_t width);
// The masks of core/rng.h's random_u64 computed on the device (the same bits as the CPU's).
void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p);
void dropout_add(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p);
void to_bf16(const float* x, int64_t n, uint16_t* y);
void from_bf16(const uint16_t* x, int64_t n, float* y);

// ---- attention.h (ops/cuda/attention.cu: FlashAttention-2's tiling on CUDA cores, d <= 256;
// the workspace arguments are unused and may be null)
void attention_segments(const int32_t* positions, int64_t B, int64_t S, bool block_causal,
                        int32_t* seg_start);
void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const int32_t* seg_start, float* o, float* lse, float* workspace);
void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dout, const int32_t* seg_start,
                   float* dq, float* dk, float* dv, float* delta, float* workspace);
void attention_fwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const int32_t* seg_start, float* o, float* lse, float* workspace);
void attention_bwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout,
                        const int32_t* seg_start, float* dq, float* dk, float* dv, float* delta,
                        float* workspace);
// k and v: device arrays of T device pointers; n_keys: a device array.
void attention_cached(const float* q, int64_t ldq, const float* const* k, const float* const* v,
                      const int32_t* n_keys, int64_t ldkv, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t d, float scale, float* o);

// ---- loss.h (scratch: lm_head_ce_scratch / lm_head_ce_bf16_scratch floats of device memory;
// the per-row losses are summed in token order, as the CPU sums them)
LossSum lm_head_ce(const float* h, const float* w, const int32_t* labels, int64_t T, int64_t D,
                   int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                   float* scratch);
LossSum lm_head_ce_vocab_parallel(const float* h, const float* w, const uint16_t* w_bf16,
                                  const int32_t* labels, int64_t T, int64_t D, int64_t V,
                                  int64_t v0, int64_t Vr, int64_t chunk_rows, float grad_scale,
                                  float* dh, float* dw, float* scratch, RankReducer& red);
LossSum lm_head_ce_bf16(const float* h, const uint16_t* w, const int32_t* labels, int64_t T,
                        int64_t D, int64_t V, int64_t chunk_rows, float grad_scale, float* dh,
                        float* dw, float* scratch);

// ---- router.h (load, counts, hits, psum: device double arrays)
void router_fwd(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K, bool norm,
                float* p, int32_t* idx, float* w);
void router_bwd(const float* p, const int32_t* idx, const float* w, const float* dw,
                const float* dp_extra, int64_t T, int64_t E, int64_t K, bool norm, float* dlogits);
void topk_rows(const float* p, int64_t T, int64_t E, int64_t K, int32_t* idx);
void count_experts(const int32_t* idx, int64_t T, int64_t K, int64_t E, double* counts);
void router_aux_stats(const float* p, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                      double* hits, double* psum);
void expert_bias_update(const double* load, int64_t E, double coeff, float* bias);

// ---- experts_op.h: "grouped_experts" under device cuda (ops/cuda/experts.cu; saved and scratch
// in device memory); registered by builtins.cpp when built with CUDA.
GroupedExpertsOp grouped_experts_op(bool bf16);

// ---- gemm.h (row-major, leading dimensions in elements)
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
void linear_fwd(const float* x, const float* w, float* y, int64_t M, int64_t in, int64_t out);
void linear_bwd(const float* dy, const float* x, const float* w, float* dx, float* dw, int64_t M,
                int64_t in, int64_t out, bool dx_accumulate);
void linear_fwd_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t in,
                     int64_t out, uint16_t* scratch);
void linear_bwd_bf16(const float* dy, const float* x, const uint16_t* w, float* dx, float* dw,
                     int64_t M, int64_t in, int64_t out, bool dx_accumulate, uint16_t* scratch);

}  // namespace titan::ops::cuda
