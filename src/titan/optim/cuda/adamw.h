// The optimizer's kernels on the GPU: optim/adamw.h's functions with the same signatures and
// semantics, their arrays in device memory (ops/cuda/cuda_ops.h: built with TITAN_CUDA; no CUDA
// type here).
//   adamw_step    one fused pass over p, g, m, v
//   sum_squares   Σ x² in double over fixed blocks, then the blocks in order: deterministic (the
//                 result is copied to the host)
//   clip_by_norm  g ← g·min(1, max_norm/(norm + 1e-6))
//   adamw_step_bf16  adamw_step with bf16 moments, stochastically rounded (optim/adamw_math.h)
//   adamw_step_q8    adamw_step with 8-bit block-wise moments: one thread block per block
#pragma once
#include <cstdint>

#include "titan/optim/adamw.h"

namespace titan::optim::cuda {

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConfig& c,
                float lr, int64_t step);
double sum_squares(const float* x, int64_t n);
void clip_by_norm(float* g, int64_t n, double norm, double max_norm);
void adamw_step_bf16(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                     const AdamWConfig& c, float lr, int64_t step, uint64_t key);
void adamw_step_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                   float* absmax_v, const int64_t* begin, int64_t nblocks, const AdamWConfig& c,
                   float lr, int64_t step);

}  // namespace titan::optim::cuda
