// The CPU backends (fp32, and bf16 mixed precision): the kernels of ops/cpu/ (whose contracts are
// the op headers) and host memory.
#include "titan/ops/backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "titan/core/buffer.h"

namespace titan::ops {
namespace {

void* host_alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p && bytes) throw OutOfMemory(bytes);
  return p;
}
void host_free(void* p) { std::free(p); }
void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void host_memset(void* dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
}

}  // namespace

Backend cpu_backend() {
  Backend b;
  b.device = "cpu";
  b.dtype = "float32";
  b.alloc = host_alloc;
  b.free = host_free;
  b.copy = host_copy;
  b.memset = host_memset;
  b.embedding_fwd = ops::embedding_fwd;
  b.embedding_bwd = ops::embedding_bwd;
  b.embedding_fwd_range = ops::embedding_fwd_range;
  b.embedding_bwd_range = ops::embedding_bwd_range;
  b.rmsnorm_fwd = ops::rmsnorm_fwd;
  b.rmsnorm_bwd = ops::rmsnorm_bwd;
  b.rope_table = ops::rope_table;
  b.first_bad_position = ops::first_bad_position;
  b.swiglu_fwd = ops::swiglu_fwd;
  b.swiglu_bwd = ops::swiglu_bwd;
  b.add = ops::add;
  b.add_inplace = ops::add_inplace;
  b.scale_inplace = ops::scale_inplace;
  b.copy_rows = ops::copy_rows;
  b.sum_rows = ops::sum_rows;
  b.dropout = ops::dropout;
  b.dropout_add = ops::dropout_add;
  b.gemm = ops::gemm;
  b.linear_fwd = ops::linear_fwd;
  b.linear_bwd = ops::linear_bwd;
  b.attention_segments = ops::attention_segments;
  b.attention_fwd = ops::attention_fwd;
  b.attention_bwd = ops::attention_bwd;
  b.attention_cached = ops::attention_cached;
  b.attention_workspace = ops::attention_workspace;
  b.lm_head_ce = ops::lm_head_ce;
  b.lm_head_ce_vocab_parallel = ops::lm_head_ce_vocab_parallel;
  b.router_fwd = ops::router_fwd;
  b.router_bwd = ops::router_bwd;
  b.topk_rows = ops::topk_rows;
  b.count_experts = ops::count_experts;
  b.router_aux_stats = ops::router_aux_stats;
  b.expert_bias_update = ops::expert_bias_update;
  return b;
}

Backend cpu_bf16_backend() {
  Backend b = cpu_backend();
  b.dtype = "bfloat16";
  b.to_bf16 = ops::to_bf16;
  b.from_bf16 = ops::from_bf16;
  b.linear_fwd_bf16 = ops::linear_fwd_bf16;
  b.linear_bwd_bf16 = ops::linear_bwd_bf16;
  b.lm_head_ce_bf16 = ops::lm_head_ce_bf16;
  b.attention_fwd = ops::attention_fwd_bf16;  // bf16 products, fp32 softmax
  b.attention_bwd = ops::attention_bwd_bf16;
  b.attention_workspace = ops::attention_bf16_workspace;
  return b;
}

}  // namespace titan::ops
