// The CUDA backend tables (ops/backend.h) for cuda/float32 and cuda/bfloat16: the kernels of
// ops/cuda/cuda_ops.h, which have the op headers' signatures. Registered by builtin_backends()
// when titan is built with CUDA; a complete table (register_backend checks every member).
#include "titan/ops/backend.h"
#include "titan/ops/cuda/cuda_ops.h"

namespace titan::ops::cuda {

Backend backend(bool bf16) {
  Backend b;
  b.device = "cuda";
  b.dtype = bf16 ? "bfloat16" : "float32";
  b.alloc = &cuda::alloc;
  b.free = &cuda::free;
  b.copy = &cuda::copy;
  b.memset = &cuda::memset;
  b.reserve = &cuda::reserve;
  b.commit = &cuda::commit;
  b.decommit = &cuda::decommit;
  b.embedding_fwd = &cuda::embedding_fwd;
  b.embedding_bwd = &cuda::embedding_bwd;
  b.embedding_fwd_range = &cuda::embedding_fwd_range;
  b.embedding_bwd_range = &cuda::embedding_bwd_range;
  b.rmsnorm_fwd = &cuda::rmsnorm_fwd;
  b.rmsnorm_bwd = &cuda::rmsnorm_bwd;
  b.rope_table = &cuda::rope_table;
  b.first_bad_position = &cuda::first_bad_position;
  b.swiglu_fwd = &cuda::swiglu_fwd;
  b.swiglu_bwd = &cuda::swiglu_bwd;
  b.add = &cuda::add;
  b.add_inplace = &cuda::add_inplace;
  b.scale_inplace = &cuda::scale_inplace;
  b.copy_rows = &cuda::copy_rows;
  b.sum_rows = &cuda::sum_rows;
  b.dropout = &cuda::dropout;
  b.dropout_add = &cuda::dropout_add;
  b.gemm = &cuda::gemm;
  b.linear_fwd = &cuda::linear_fwd;
  b.linear_bwd = &cuda::linear_bwd;
  b.attention_segments = &cuda::attention_segments;
  b.attention_fwd = bf16 ? &cuda::attention_fwd_bf16 : &cuda::attention_fwd;
  b.attention_bwd = bf16 ? &cuda::attention_bwd_bf16 : &cuda::attention_bwd;
  b.attention_cached = &cuda::attention_cached;
  b.attention_workspace = [](const AttnShape&) -> int64_t { return 0; };  // scratch of their own
  b.lm_head_ce = &cuda::lm_head_ce;
  b.lm_head_ce_vocab_parallel = &cuda::lm_head_ce_vocab_parallel;
  b.router_fwd = &cuda::router_fwd;
  b.router_bwd = &cuda::router_bwd;
  b.topk_rows = &cuda::topk_rows;
  b.count_experts = &cuda::count_experts;
  b.router_aux_stats = &cuda::router_aux_stats;
  b.expert_bias_update = &cuda::expert_bias_update;
  if (bf16) {
    b.to_bf16 = &cuda::to_bf16;
    b.from_bf16 = &cuda::from_bf16;
    b.linear_fwd_bf16 = &cuda::linear_fwd_bf16;
    b.linear_bwd_bf16 = &cuda::linear_bwd_bf16;
    b.lm_head_ce_bf16 = &cuda::lm_head_ce_bf16;
  }
  return b;
}

}  // namespace titan::ops::cuda
