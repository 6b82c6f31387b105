// Qwen3's parallel plan (torchtitan's models/qwen3/infra/parallelize.py with the sharding plan of
// models/qwen3/sharding.py): which dimension of each parameter tensor parallelism splits, how
// each activation divides over the tp ranks, the widths of one rank's slice, the layout checks
// with torchtitan's words, and the step that installs a built model's redistributions
// (models/redistribute.h) over its tp group. Expert parallelism comes in as the dispatch the
// trainer wraps around each grouped-experts op (models::BuildOptions::wrap_experts) and FSDP
// over the parameter store's units (parallel/fsdp.h), neither of them Qwen3's.
#pragma once
#include <string>

#include "titan/models/context_parallel.h"
#include "titan/models/model.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/tensor_parallel.h"

namespace titan::qwen3 {

// A parallel layout as the checks see it: the tp and ep degrees, sequence parallelism and the
// tokens per microbatch (local_batch_size × seq_len).
struct ParallelLayout {
  int64_t tp = 1, ep = 1;
  bool sequence_parallel = false;
  int64_t tokens = 0;
};

// Throws titan::Error naming the field when the layout cannot split `a` into whole heads, hidden
// units and experts (torchtitan's validate_tp_constraints and MoE checks); `source` names the
// architecture ("flavor 'debugmodel'", "DIR/config.json").
void check_parallel_layout(const Qwen3Args& a, const ParallelLayout& p, const std::string& source);

// The plan: the placement of parameter `fqn` (embedding and lm_head on the vocabulary, wq, wk,
// wv, w1, w3 column-wise, wo, w2 row-wise, experts on the expert dimension; norms, q/k norms and
// the router replicated) and the dimension its slice splits (-1: whole on every rank).
models::ParamInfo::Tp tp_placement(const std::string& fqn);
int tp_split_dim(const std::string& fqn);
// How an activation-table entry divides over the tp ranks, by its name (a "recompute." entry
// as the tensor it recomputes).
models::TensorSize::Tp tp_split(std::string name);

// One rank's slice: heads, projection widths, feed-forward and experts' hidden units and its
// vocabulary rows [v0, v0 + vl) (the whole model's without tensor parallelism).
struct SliceWidths {
  int64_t hq, hkv, q, kv, qkv, f, fm, v0, vl;
};
SliceWidths slice_widths(const Qwen3Args& a, const models::TpSlice& tp);

// torchtitan's parallelize_qwen3 for a model built on a tp slice: its redistributions over the
// group's collectives. A no-op on a whole model.
void parallelize(models::Model& model, models::TpHooks* tp);
// torchtitan's apply_cp: attention over the cp group (models/context_parallel.h).
void context_parallel(models::Model& model, const models::ContextAttention& cp);

}  // namespace titan::qwen3
