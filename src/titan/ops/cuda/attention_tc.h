// The bf16 attention on tensor cores (ops/cuda/attention_tc.cu), which attention_fwd_bf16 and
// attention_bwd_bf16 (ops/cuda/attention.cu) run for the head sizes it supports; device
// pointers, attention.h's layouts. Not included outside ops/cuda.
#pragma once
#include <cstdint>

#include "titan/ops/attention.h"

namespace titan::ops::cuda {

// head_dim 64 or 128.
bool attention_tc_supports(const AttnShape& s);
void attention_fwd_tc(const AttnShape& s, const float* q, const float* k, const float* v,
                      const int32_t* seg_start, float* o, float* lse);
// delta: rowsum(dout ⊙ o) [B, Hq, S], computed by the caller.
void attention_bwd_tc(const AttnShape& s, const float* q, const float* k, const float* v,
                      const float* lse, const float* dout, const int32_t* seg_start,
                      const float* delta, float* dq, float* dk, float* dv);

}  // namespace titan::ops::cuda
