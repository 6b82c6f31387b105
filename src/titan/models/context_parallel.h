// Context parallelism as the model sees it (torchtitan's context_parallel_degree with the head-tail
// load balancer and the all-gather rotation, PyTorch's context_parallel): the sequence of every
// microbatch row is split over the cp ranks of a group, and only attention looks across them.
//
// Layout (torchtitan's _HeadTailLoadBalancer): a row of S tokens is cut into 2·cp chunks of
// L = S / (2·cp); rank r holds chunk r then chunk 2·cp − 1 − r, so its row is S/cp = 2·L tokens
// and every rank gets the same share of the causal square. Everything but attention (norms,
// projections, RoPE with the global positions the data carries, the loss) works on the local
// tokens alone.
//
// ContextAttention, the one redistribution point:
//   forward:  k|v of the local rows all-gathered over the group and put in global order
//             [B, S, 2·KV]; each local chunk c's queries attend to keys [0, (c+1)·L) with the
//             single-rank kernel (ops::AttnShape's q0 = c·L, Sk = (c+1)·L), so o and lse are
//             exact, not merged.
//   backward: each chunk's dq, and its dk, dv added over the whole gathered sequence;
//             the dk|dv of every rank's rows reduce-scattered back to their owners.
// The mask: key j is visible to global query g iff doc_start(g) <= j <= g, with doc_start from
// the data's positions (g − position, positions counting up by one within a document, as the
// loaders make them; 0 for plain causal attention).
//
// The model calls it where it would call the backend's attention; with a group of one it is the
// backend's attention itself. The group's collectives come through CpHooks (the trainer's,
// parallel/context_parallel.h), so the model never sees a communicator. CPU backends only.
#pragma once
#include <cstdint>
#include <vector>

#include "titan/ops/backend.h"

namespace titan::models {

struct CpSlice {
  int rank = 0, size = 1;
  bool active() const { return size > 1; }
  // The global chunk of local piece p (0 or 1) of a row.
  int64_t chunk(int p) const { return p == 0 ? rank : 2 * size - 1 - rank; }
  // The global index of local token i of a row of S_local = 2·L tokens.
  int64_t global_index(int64_t i, int64_t S_local) const {
    const int64_t L = S_local / 2;
    return chunk(i < L ? 0 : 1) * L + i % L;
  }
};

// The cp group's collectives. Every rank of the group calls them in the same order with the
// same sizes; the buffers are host memory.
class CpHooks {
 public:
  virtual ~CpHooks() = default;
  // out[P·n] ← every rank's in[n], in rank order.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  // out[n] ← Σ over ranks of their in[rank·n, (rank+1)·n).
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
  virtual void all_reduce_f64(double* x, int64_t n) = 0;
};

class ContextAttention {
 public:
  ContextAttention() = default;
  ContextAttention(const CpSlice& slice, CpHooks* hooks) : slice_(slice), hooks_(hooks) {}
  bool active() const { return slice_.active(); }
  const CpSlice& slice() const { return slice_; }
  CpHooks* hooks() const { return hooks_; }

  // seg_start[B·S] of this rank's tokens as indices into the gathered row (attention.h's
  // attention_segments for the whole row, restricted to this rank's tokens).
  void segments(const ops::Backend& be, const int32_t* positions, int64_t B, int64_t S,
                bool block_causal, int32_t* seg_start) const;
  // attention_fwd / attention_bwd of the backend over the whole sequence, for this rank's
  // queries (s: the local shape, s.S = S/cp). workspace: the model's, used without CP.
  void forward(const ops::Backend& be, const ops::AttnShape& s, const float* q, const float* k,
               const float* v, const int32_t* seg_start, float* o, float* lse, float* workspace);
  void backward(const ops::Backend& be, const ops::AttnShape& s, const float* q, const float* k,
                const float* v, const float* o, const float* lse, const float* dout,
                const int32_t* seg_start, float* dq, float* dk, float* dv, float* delta,
                float* workspace);

 private:
  // The gathered k|v in global order; the local rows packed (and their gradients).
  void gather_kv(const ops::AttnShape& s, const float* k, const float* v);
  ops::AttnShape chunk_shape(const ops::AttnShape& s, int p) const;
  void size_workspace(const ops::Backend& be, const ops::AttnShape& s);
  CpSlice slice_;
  CpHooks* hooks_ = nullptr;
  std::vector<float> kv_, local_, dkv_, ranks_, ws_, lse_, delta_;
};

}  // namespace titan::models
