// Scaled dot-product attention with GQA and causal / block-causal masks, computed in tiles with
// an online softmax (FlashAttention-2 style). Never forms a sequence-by-sequence matrix: each
// thread holds one [Br, Bc] score tile.
//
// Shapes (T = B·S tokens, row-major, token stride ld*):
//   q[T, Hq, d]   k[T, Hkv, d]   v[T, Hkv, d]   ->  o[T, Hq·d] (contiguous),  lse[B, Hq, S]
// Query head h reads kv head h / (Hq/Hkv) (HF repeat_kv). Key j is visible to query i of the same
// row iff seg_start[i] <= j <= i, where seg_start[i] is the index (within the row) where i's
// document begins: 0 for plain causal attention, the last position-0 token for block-causal.
//
// Context parallelism calls the same kernels on part of a row: the S queries are rows
// [q0, q0 + S) of a sequence of Sk keys (k[B·Sk, Hkv, d], v likewise), key j visible to query i
// iff seg_start[i] <= j <= q0 + i (seg_start indexes the keys); dk and dv are [B·Sk] rows and,
// with accumulate, the backward adds into them. The defaults (Sk = 0: S; q0 = 0) are the plain
// case above.
#pragma once
#include <cstdint>

namespace titan::ops {

struct AttnShape {
  int64_t B, S, Hq, Hkv, d;
  float scale;  // usually d^-0.5
  int64_t ldq, ldk, ldv;
  int64_t Sk = 0, q0 = 0;   // keys per row (0: S) and the first query's index among them
  bool accumulate = false;  // attention_bwd adds into dk and dv
  int64_t keys() const { return Sk ? Sk : S; }
};

// seg_start[B·S] from per-token positions (restarting at 0 at each document) when block_causal,
// else all zeros (plain causal).
void attention_segments(const int32_t* positions, int64_t B, int64_t S, bool block_causal,
                        int32_t* seg_start);

// Workspace, in floats, for forward and backward: the transposed keys and values of the call
// plus one tile set per OpenMP thread (omp_get_max_threads() at the time of the call).
int64_t attention_workspace(const AttnShape& s);

// o = softmax(q·kᵀ·scale + mask)·v; lse = log Σ exp(scores) per query (saved for the backward).
void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const int32_t* seg_start, float* o, float* lse, float* workspace);

// Backward of attention_fwd. dq is [T, Hq, d] (token stride Hq·d, written); dk, dv are written
// with token strides ldk, ldv (the layout of k and v). delta: B·Hq·S floats of scratch
// (rowsum(do ⊙ o)). Probabilities are recomputed from q, k and lse; dq is computed in a pass
// over query tiles and dk/dv in a pass over key tiles, so nothing is reduced across threads.
void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dout, const int32_t* seg_start,
                   float* dq, float* dk, float* dv, float* delta, float* workspace);

// bf16 mixed precision (ops/cpu/attention_bf16.cpp): the same contract, with every product of
// the attention a bf16 GEMM with fp32 accumulation (q, k, v, dout, the probabilities and dS
// rounded to bf16 for them); scores, softmax, lse and the softmax backward in fp32. The
// workspace holds bf16 copies of q, k, v, dout and one [128, S] block of scores: see
// attention_bf16_workspace.
int64_t attention_bf16_workspace(const AttnShape& s);
void attention_fwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const int32_t* seg_start, float* o, float* lse, float* workspace);
void attention_bwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout,
                        const int32_t* seg_start, float* dq, float* dk, float* dv, float* delta,
                        float* workspace);

}  // namespace titan::ops

namespace titan::ops {

// Attention of new tokens against a key/value cache (generation: a prompt's prefill, then one
// token per step). For each new token t (of T) and query head h:
//   o[t, h] = Σ_{j < n_keys[t]} softmax_j(q[t,h]·k_t[j, g]·scale) · v_t[j, g],   g = h / (Hq/Hkv)
// where k_t = k[t], v_t = v[t] point at the cached keys/values of t's sequence ([n, Hkv·d],
// row stride ldkv; the new tokens' own rows already appended), and n_keys[t] = t's position + 1
// (causal: a token sees its sequence up to itself). q[T, Hq, d] has token stride ldq; o[T, Hq·d]
// is contiguous. Scores, softmax and sums in fp32; the softmax subtracts the row maximum.
// Parallel over (token, head); no workspace (a thread's scores are on its stack or heap).
void attention_cached(const float* q, int64_t ldq, const float* const* k, const float* const* v,
                      const int32_t* n_keys, int64_t ldkv, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t d, float scale, float* o);

}  // namespace titan::ops
