// AdamW exactly as torch.optim.AdamW (single-tensor path, decoupled weight decay):
//   p ← p·(1 − lr·wd);  m ← m + (1−β1)(g − m);  v ← β2·v + (1−β2)·g²
//   p ← p − (lr / (1−β1^t)) · m / (sqrt(v)/sqrt(1−β2^t) + eps)
// and global L2 gradient-norm clipping as torch.nn.utils.clip_grad_norm_.
#pragma once
#include <cstdint>

#include "titan/optim/adamw_math.h"

namespace titan::optim {

struct AdamWConfig {
  float lr = 8e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};

// One update of n parameters; `step` is the 1-based step count after this update.
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConfig& c,
                float lr, int64_t step);

// The same update with the moments stored in bf16 (their bit patterns): each element's m and v
// are widened to fp32, updated as above and stored back with stochastic rounding
// (optim/adamw_math.h), the random bits of element i drawn from (key, i). p and g stay fp32.
void adamw_step_bf16(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                     const AdamWConfig& c, float lr, int64_t step, uint64_t key);

// The same update with 8-bit moments (bitsandbytes' AdamW8bit, block-wise; optim/adamw_math.h):
// block b covers elements [begin[b], begin[b + 1]) of p, g, m and v (begin has nblocks + 1
// entries, each block at most kQ8Block long); m and v hold its codes in q8_map(true) and
// q8_map(false), absmax_m[b] and absmax_v[b] its scales. Each block is decoded to fp32, updated
// as above, and encoded again with its new absmax.
void adamw_step_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                   float* absmax_v, const int64_t* begin, int64_t nblocks, const AdamWConfig& c,
                   float lr, int64_t step);

// The 256-value quantization maps of the 8-bit moments, sorted: signed (m, from -0.993 to 1) or
// unsigned (v, from 0 to 1); bitsandbytes' create_dynamic_map(signed).
const float* q8_map(bool is_signed);

// adamw_math.h's q8_encode(x, q8_map(is_signed)) through a table of 65,536 buckets (the CPU
// kernel's encoder): the same index for every x.
uint8_t q8_encode_fast(float x, bool is_signed);

// The step's constants (bias corrections, decay) for the per-element update.
AdamWConsts adamw_consts(const AdamWConfig& c, float lr, int64_t step);

// Σ x² in double over fixed blocks (the result does not depend on the thread count).
double sum_squares(const float* x, int64_t n);

// Multiplies grads by min(1, max_norm / (norm + 1e-6)) (torch clip_grads_with_norm_).
void clip_by_norm(float* g, int64_t n, double norm, double max_norm);

}  // namespace titan::optim
