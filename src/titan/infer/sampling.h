// Choosing the next token from logits, as transformers' generate does: greedy (argmax, the first
// of equal maxima, as torch.argmax), or sampling after its logits warpers in its order —
// temperature (logits / T), top-k (logits below the k-th largest set to -inf; equal values
// kept), top-p (ascending sort, softmax, cumulative sum; tokens whose cumulative probability is
// <= 1 - p removed, the most probable always kept) — then one draw from softmax of what is left.
// The draws come from titan's counter-based generator (core/rng.h): reproducible for a seed, not
// torch's multinomial stream.
#pragma once
#include <cstdint>

namespace titan::infer {

struct Sampling {
  bool greedy = true;
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // (0, 1]; 1: off
  uint64_t seed = 0;
};

// Applies temperature, top-k and top-p to logits[0:V] in place (removed tokens become -inf).
void warp_logits(float* logits, int64_t V, const Sampling& s);

// The next token. Sampling warps `logits` in place and draws value `draw` of stream `stream`
// (e.g. the prompt's index and the step) under s.seed.
int32_t next_token(float* logits, int64_t V, const Sampling& s, uint64_t stream, uint64_t draw);

}  // namespace titan::infer
