// lm_head + cross-entropy in row chunks, forward and backward in one pass: logits for at most
// `chunk_rows` tokens exist at a time, never all [T, V].
//
//   logits[t] = h[t] · wᵀ            h[T, D], w[V, D] (lm_head weight)
//   ce[t]     = logsumexp(logits[t]) − logits[t][label[t]]   for label[t] != -100
//   returns Σ_t ce[t] (double) and the count of valid labels
// With grad_scale != 0 (usually 1 / valid tokens of the whole step), also
//   dh[t]  = grad_scale · (softmax(logits[t]) − onehot(label[t])) · w      (written)
//   dw    += grad_scale · Σ_t (softmax(logits[t]) − onehot(label[t]))ᵀ · h[t]   (dw may be null)
// Rows with label -100 contribute nothing and get dh = 0.
#pragma once
#include <cstdint>

namespace titan::ops {

constexpr int32_t kIgnoreIndex = -100;

struct LossSum {
  double sum = 0.0;
  int64_t count = 0;
};

// scratch: chunk_rows·V + T floats.
int64_t lm_head_ce_scratch(int64_t T, int64_t V, int64_t chunk_rows);

LossSum lm_head_ce(const float* h, const float* w, const int32_t* labels, int64_t T, int64_t D,
                   int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                   float* scratch);

// The same with the bf16 compute copy of the weight (mixed precision): each chunk's h and logit
// gradient are rounded to bf16 for the three GEMMs (fp32 accumulation, as torch.autocast's bf16
// Linear); logits, log-sum-exp, softmax and the CE stay fp32 (torchtitan computes the loss in
// fp32). dw is the fp32 gradient. scratch: lm_head_ce_bf16_scratch floats.
int64_t lm_head_ce_bf16_scratch(int64_t T, int64_t V, int64_t D, int64_t chunk_rows);
LossSum lm_head_ce_bf16(const float* h, const uint16_t* w, const int32_t* labels, int64_t T,
                        int64_t D, int64_t V, int64_t chunk_rows, float grad_scale, float* dh,
                        float* dw, float* scratch);

}  // namespace titan::ops
