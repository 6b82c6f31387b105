#include "titan/models/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "titan/core/error.h"

namespace titan::models {

namespace {
// Copies L rows of w floats.
void copy_rows(const float* from, float* to, int64_t L, int64_t w) {
  std::memcpy(to, from, sizeof(float) * static_cast<size_t>(L * w));
}

// Moves the chunks of P ranks' rows between rank order [P, B, Sl, W] (what the collectives
// exchange; Sl = 2·L tokens per rank and row) and global order [B, P·Sl, W]: ranks → global when
// to_global, else global → ranks.
void reorder_chunks(int P, int64_t B, int64_t Sl, int64_t W, float* ranks, float* global,
                    bool to_global) {
  const int64_t L = Sl / 2, S = Sl * P;
  for (int r = 0; r < P; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int p = 0; p < 2; ++p) {
        float* at_rank = ranks + ((r * B + b) * Sl + p * L) * W;
        float* at_global = global + (b * S + CpSlice{r, P}.chunk(p) * L) * W;
        if (to_global)
          copy_rows(at_rank, at_global, L, W);
        else
          copy_rows(at_global, at_rank, L, W);
      }
}
}  // namespace

void ContextAttention::segments(const ops::Backend& be, const int32_t* positions, int64_t B,
                                int64_t S, bool block_causal, int32_t* seg_start) const {
  if (!active()) {
    be.attention_segments(positions, B, S, block_causal, seg_start);
    return;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      const int64_t g = slice_.global_index(i, S), t = b * S + i;
      seg_start[t] =
          block_causal ? static_cast<int32_t>(std::max<int64_t>(0, g - positions[t])) : 0;
    }
}

ops::AttnShape ContextAttention::chunk_shape(const ops::AttnShape& s, int p) const {
  const int64_t L = s.S / 2, c = slice_.chunk(p), W = 2 * s.Hkv * s.d;
  ops::AttnShape a = s;
  a.B = 1;
  a.S = L;
  a.ldk = a.ldv = W;
  a.Sk = (c + 1) * L;
  a.q0 = c * L;
  return a;
}

void ContextAttention::size_workspace(const ops::Backend& be, const ops::AttnShape& s) {
  ws_.resize(static_cast<size_t>(std::max(be.attention_workspace(chunk_shape(s, 0)),
                                          be.attention_workspace(chunk_shape(s, 1)))));
}

void ContextAttention::gather_kv(const ops::AttnShape& s, const float* k, const float* v) {
  const int64_t P = slice_.size, T = s.B * s.S, KV = s.Hkv * s.d, W = 2 * KV;
  local_.resize(static_cast<size_t>(T * W));
  for (int64_t t = 0; t < T; ++t) {
    copy_rows(k + t * s.ldk, local_.data() + t * W, 1, KV);
    copy_rows(v + t * s.ldv, local_.data() + t * W + KV, 1, KV);
  }
  ranks_.resize(static_cast<size_t>(P * T * W));
  hooks_->all_gather(local_.data(), ranks_.data(), T * W);
  kv_.resize(static_cast<size_t>(P * T * W));
  reorder_chunks(slice_.size, s.B, s.S, W, ranks_.data(), kv_.data(), /*to_global=*/true);
}

void ContextAttention::forward(const ops::Backend& be, const ops::AttnShape& s, const float* q,
                               const float* k, const float* v, const int32_t* seg_start, float* o,
                               float* lse, float* workspace) {
  if (!active()) {
    be.attention_fwd(s, q, k, v, seg_start, o, lse, workspace);
    return;
  }
  check(s.S % 2 == 0, "context parallelism: a rank's row of " + std::to_string(s.S) +
                          " tokens is not two equal chunks");
  gather_kv(s, k, v);
  const int64_t Sl = s.S, L = Sl / 2, S = Sl * slice_.size, W = 2 * s.Hkv * s.d, ldo = s.Hq * s.d;
  size_workspace(be, s);
  lse_.resize(static_cast<size_t>(s.Hq * L));
  for (int64_t b = 0; b < s.B; ++b)
    for (int p = 0; p < 2; ++p) {
      const int64_t t0 = b * Sl + p * L;
      const float* kv = kv_.data() + b * S * W;
      be.attention_fwd(chunk_shape(s, p), q + t0 * s.ldq, kv, kv + W / 2, seg_start + t0,
                       o + t0 * ldo, lse_.data(), ws_.data());
      for (int64_t h = 0; h < s.Hq; ++h)
        copy_rows(lse_.data() + h * L, lse + (b * s.Hq + h) * Sl + p * L, 1, L);
    }
}

void ContextAttention::backward(const ops::Backend& be, const ops::AttnShape& s, const float* q,
                                const float* k, const float* v, const float* o, const float* lse,
                                const float* dout, const int32_t* seg_start, float* dq, float* dk,
                                float* dv, float* delta, float* workspace) {
  // delta and workspace are the model's, sized for its own calls; the chunks' calls use this
  // object's.
  if (!active()) {
    be.attention_bwd(s, q, k, v, o, lse, dout, seg_start, dq, dk, dv, delta, workspace);
    return;
  }
  // The keys and values are gathered again rather than kept from the forward: one [B, S, 2·KV]
  // buffer for the whole model instead of one per layer.
  gather_kv(s, k, v);
  const int64_t P = slice_.size, Sl = s.S, L = Sl / 2, S = Sl * P, T = s.B * Sl;
  const int64_t KV = s.Hkv * s.d, W = 2 * KV, ldo = s.Hq * s.d;
  dkv_.assign(static_cast<size_t>(s.B * S * W), 0.f);
  size_workspace(be, s);
  lse_.resize(static_cast<size_t>(s.Hq * L));
  delta_.resize(static_cast<size_t>(s.Hq * L));
  for (int64_t b = 0; b < s.B; ++b)
    for (int p = 0; p < 2; ++p) {
      const int64_t t0 = b * Sl + p * L;
      for (int64_t h = 0; h < s.Hq; ++h)
        copy_rows(lse + (b * s.Hq + h) * Sl + p * L, lse_.data() + h * L, 1, L);
      ops::AttnShape c = chunk_shape(s, p);
      c.accumulate = true;
      const float* kv = kv_.data() + b * S * W;
      float* dkv = dkv_.data() + b * S * W;
      be.attention_bwd(c, q + t0 * s.ldq, kv, kv + KV, o + t0 * ldo, lse_.data(), dout + t0 * ldo,
                       seg_start + t0, dq + t0 * ldo, dkv, dkv + KV, delta_.data(), ws_.data());
    }
  // Every rank's rows of the sums back in rank order, then summed over the group to their owner.
  reorder_chunks(slice_.size, s.B, Sl, W, ranks_.data(), dkv_.data(), /*to_global=*/false);
  hooks_->reduce_scatter(ranks_.data(), local_.data(), T * W);
  for (int64_t t = 0; t < T; ++t) {
    copy_rows(local_.data() + t * W, dk + t * s.ldk, 1, KV);
    copy_rows(local_.data() + t * W + KV, dv + t * s.ldv, 1, KV);
  }
}

}  // namespace titan::models
