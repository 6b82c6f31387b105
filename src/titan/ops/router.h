// The MoE token-choice router (HF Qwen3MoeTopKRouter; torchtitan TokenChoiceTopKRouter) after
// its gate linear, and the load statistics built on it. T tokens, E experts, K experts per
// token; all fp32 (HF computes the softmax in fp32 too).
//
//   router_fwd:  p[t,:]   = softmax(logits[t,:])                      (logits[T,E] → p[T,E])
//                idx[t,:] = the K experts with the largest p[t,e] + bias[e], in descending
//                           order; equal values go to the lower expert index
//                w[t,j]   = p[t, idx[t,j]]            (/ Σ_j p[t, idx[t,j]] when norm)
//   router_bwd:  the backward of router_fwd w.r.t. logits, given dw[T,K] (∂L/∂w) and an
//                optional dense term dp_extra[E] added to ∂L/∂p[t,e] for every token (the
//                auxiliary loss's gradient); idx is not differentiable. dlogits[T,E] written.
#pragma once
#include <cstdint>

namespace titan::ops {

// bias: [E] added for the selection only (torchtitan's expert_bias), or nullptr.
void router_fwd(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K, bool norm,
                float* p, int32_t* idx, float* w);

void router_bwd(const float* p, const int32_t* idx, const float* w, const float* dw,
                const float* dp_extra, int64_t T, int64_t E, int64_t K, bool norm, float* dlogits);

// Top-K of p[t,:] alone (no bias), in the order router_fwd uses: the selection HF's auxiliary
// loss makes. idx[T,K] written.
void topk_rows(const float* p, int64_t T, int64_t E, int64_t K, int32_t* idx);

// counts[e] += number of (t, j) with idx[t,j] == e.
void count_experts(const int32_t* idx, int64_t T, int64_t K, int64_t E, double* counts);

// One layer's statistics for HF's auxiliary load-balancing loss, accumulated in double:
// hits[e] += number of (t, j) with idx[t,j] == e (as count_experts), and
// psum[e] += Σ_t p[t,e], added in order of t.
void router_aux_stats(const float* p, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                      double* hits, double* psum);

// torchtitan's aux-loss-free load balancing for one layer, given the tokens per expert load[E]
// of the step: delta[e] = float(coeff)·sign(mean(load) − load[e]) (mean in double), then
// bias[e] += delta[e] − mean(delta) (fp32, delta summed in order of e).
void expert_bias_update(const double* load, int64_t E, double coeff, float* bias);

}  // namespace titan::ops
