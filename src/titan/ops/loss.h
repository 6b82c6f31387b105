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
inline int64_t lm_head_ce_scratch(int64_t T, int64_t V, int64_t chunk_rows) {
  return (T < chunk_rows ? T : chunk_rows) * V + T;
}

LossSum lm_head_ce(const float* h, const float* w, const int32_t* labels, int64_t T, int64_t D,
                   int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                   float* scratch);

// The same with the bf16 compute copy of the weight (mixed precision): each chunk's h and logit
// gradient are rounded to bf16 for the three GEMMs (fp32 accumulation, as torch.autocast's bf16
// Linear); logits, log-sum-exp, softmax and the CE stay fp32 (torchtitan computes the loss in
// fp32). dw is the fp32 gradient. scratch: lm_head_ce_bf16_scratch floats.
inline int64_t lm_head_ce_bf16_scratch(int64_t T, int64_t V, int64_t D, int64_t chunk_rows) {
  const int64_t n = T < chunk_rows ? T : chunk_rows;
  return lm_head_ce_scratch(T, V, chunk_rows) + (n * V + n * D + 1) / 2;  // + bf16 logits, h
}
LossSum lm_head_ce_bf16(const float* h, const uint16_t* w, const int32_t* labels, int64_t T,
                        int64_t D, int64_t V, int64_t chunk_rows, float grad_scale, float* dh,
                        float* dw, float* scratch);

// ---- Vocab-parallel form (torchtitan's loss parallelism under tensor parallelism): the lm_head
// rows are split over the P ranks of a TP group, this rank holding vocabulary rows [v0, v0 + Vr)
// of w[V, D] (w points at its first row); every rank has the same h[T, D] and labels, and no
// rank ever holds a full row of logits. Per chunk of at most chunk_rows tokens:
//   z[t]   = h[t] · w_rᵀ                               (this rank's logits, [n, Vr])
//   m[t]   = max over ranks of max_j z[t, j]            (red.max)
//   S[t]   = Σ over ranks of Σ_j exp(z[t, j] − m[t])    (red.sum, with the target logit zt[t],
//   zt[t]  = z[t, label[t] − v0] on the rank holding it  one call of 2n values)
//   ce[t]  = m[t] + log S[t] − zt[t]                    for label[t] != -100
// returns Σ_t ce[t] and the count of valid labels, the same on every rank. With grad_scale != 0:
//   g[t]   = grad_scale · (exp(z[t] − m − log S) − onehot_r(label[t]))   (0 for -100 rows)
//   dh[t]  = g[t] · w_r   written: this rank's part; the sum over ranks is h's gradient (the
//            caller reduces it: an all-reduce, or a reduce-scatter under sequence parallelism)
//   dw_r  += g ᵀ · h      (dw may be null)
// With w_bf16 (the rows' bf16 compute copy; w unused) the three GEMMs take bf16 operands as
// lm_head_ce_bf16's do. The same loss and gradients as lm_head_ce over the whole weight up to the
// order of the sums. Every rank of the group calls it with the same T, labels and chunk_rows.
class RankReducer {
 public:
  virtual ~RankReducer() = default;
  virtual void sum(float* x, int64_t n) = 0;  // in place, over the group's ranks
  virtual void max(float* x, int64_t n) = 0;
};
// scratch floats (bf16: with the bf16 operands).
inline int64_t lm_head_ce_vocab_parallel_scratch(int64_t T, int64_t Vr, int64_t D,
                                                 int64_t chunk_rows, bool bf16) {
  const int64_t n = T < chunk_rows ? T : chunk_rows;
  return n * Vr + 3 * n + (bf16 ? (n * Vr + n * D + 1) / 2 : 0);
}
LossSum lm_head_ce_vocab_parallel(const float* h, const float* w, const uint16_t* w_bf16,
                                  const int32_t* labels, int64_t T, int64_t D, int64_t V,
                                  int64_t v0, int64_t Vr, int64_t chunk_rows, float grad_scale,
                                  float* dh, float* dw, float* scratch, RankReducer& red);

}  // namespace titan::ops
