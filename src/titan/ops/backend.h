// The backend table (ggml's ggml_backend_i idea): the entry points a model calls for one
// (device, dtype), so that the model names what it computes and the backend decides where and
// how. A backend is a struct of plain function pointers: memory (alloc/free/copy/memset) and one
// member per kernel. Each kernel member has exactly the signature of the op of the same name in
// the op headers (attention.h, elementwise.h, gemm.h, loss.h, router.h), which state its maths
// and shapes; the CPU backend (ops/cpu/backend.cpp) points at those functions themselves.
//
// Not in the table: the workspace-size helpers every backend shares (rmsnorm_bwd_scratch,
// lm_head_ce_scratch, the experts op's saved/scratch sizes), which describe shapes rather than
// run device code, and the registered ops a module tree picks per layer (RoPE, grouped experts;
// plugin/registry.h).
//
// Pointers passed to the kernels point to memory of the backend's device (for the CPU backend,
// host memory). Backends are registered once per (device, dtype) and live for the process.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "titan/core/device.h"
#include "titan/ops/attention.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"
#include "titan/ops/loss.h"
#include "titan/ops/router.h"

namespace titan::ops {

struct Backend {
  std::string device;  // "cpu", "cuda", ... (core/device.h names)
  std::string dtype;   // the GEMMs' compute dtype: "float32" or "bfloat16" (mixed precision)

  // ---- memory (device memory; for the CPU backend: aligned_alloc/free/memcpy/memset)
  void* (*alloc)(size_t bytes) = nullptr;  // 64-byte aligned, uninitialized; throws bad_alloc
  void (*free)(void* p) = nullptr;         // of alloc's pointers (nullptr is a no-op)
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;  // either side host or device
  void (*memset)(void* dst, int value, size_t bytes) = nullptr;
  // Optional (all three or none; core/device.h): an address range committed and decommitted a
  // granule at a time, so that FSDP's resharded units give their device memory back.
  void* (*reserve)(size_t bytes) = nullptr;
  void (*commit)(void* p, size_t bytes) = nullptr;
  void (*decommit)(void* p, size_t bytes) = nullptr;
  // The memory functions above as core's DeviceMemory, for Storage/Buffer/Arena (core/buffer.h);
  // the CPU backend's is host memory (null functions: Storage's own aligned, mmap'd allocation).
  DeviceMemory memory() const;

  // ---- kernels: the signature of the op of the same name (no default arguments)
  decltype(&ops::embedding_fwd) embedding_fwd = nullptr;  // elementwise.h
  decltype(&ops::embedding_bwd) embedding_bwd = nullptr;
  decltype(&ops::embedding_fwd_range) embedding_fwd_range = nullptr;  // tensor parallelism
  decltype(&ops::embedding_bwd_range) embedding_bwd_range = nullptr;
  decltype(&ops::rmsnorm_fwd) rmsnorm_fwd = nullptr;
  decltype(&ops::rmsnorm_bwd) rmsnorm_bwd = nullptr;
  decltype(&ops::rope_table) rope_table = nullptr;
  decltype(&ops::first_bad_position) first_bad_position = nullptr;
  decltype(&ops::swiglu_fwd) swiglu_fwd = nullptr;
  decltype(&ops::swiglu_bwd) swiglu_bwd = nullptr;
  decltype(&ops::add) add = nullptr;
  decltype(&ops::add_inplace) add_inplace = nullptr;
  decltype(&ops::scale_inplace) scale_inplace = nullptr;
  decltype(&ops::copy_rows) copy_rows = nullptr;
  decltype(&ops::sum_rows) sum_rows = nullptr;
  decltype(&ops::dropout) dropout = nullptr;
  decltype(&ops::dropout_add) dropout_add = nullptr;
  decltype(&ops::gemm) gemm = nullptr;  // gemm.h: strided, transposes, +=
  decltype(&ops::linear_fwd) linear_fwd = nullptr;
  decltype(&ops::linear_bwd) linear_bwd = nullptr;  // dx_accumulate passed explicitly
  decltype(&ops::attention_segments) attention_segments = nullptr;  // attention.h
  decltype(&ops::attention_fwd) attention_fwd = nullptr;
  decltype(&ops::attention_bwd) attention_bwd = nullptr;
  decltype(&ops::attention_cached) attention_cached = nullptr;  // generation (fp32)
  // Floats of workspace attention_fwd/bwd take (each backend its own: the CPU's tiles per
  // thread and bf16 copies; none on the GPU).
  decltype(&ops::attention_workspace) attention_workspace = nullptr;
  decltype(&ops::lm_head_ce) lm_head_ce = nullptr;                                // loss.h
  decltype(&ops::lm_head_ce_vocab_parallel) lm_head_ce_vocab_parallel = nullptr;  // (fp32, bf16)
  decltype(&ops::router_fwd) router_fwd = nullptr;                                // router.h
  decltype(&ops::router_bwd) router_bwd = nullptr;
  decltype(&ops::topk_rows) topk_rows = nullptr;
  decltype(&ops::count_experts) count_experts = nullptr;
  decltype(&ops::router_aux_stats) router_aux_stats = nullptr;
  decltype(&ops::expert_bias_update) expert_bias_update = nullptr;

  // ---- mixed precision (required when dtype is "bfloat16": bf16 GEMM inputs, fp32 accumulation
  // and outputs; everything above stays fp32, as torchtitan keeps norms, softmax and the loss)
  decltype(&ops::to_bf16) to_bf16 = nullptr;                  // elementwise.h
  decltype(&ops::from_bf16) from_bf16 = nullptr;              // (FSDP's bf16 gathers)
  decltype(&ops::linear_fwd_bf16) linear_fwd_bf16 = nullptr;  // gemm.h
  decltype(&ops::linear_bwd_bf16) linear_bwd_bf16 = nullptr;
  decltype(&ops::lm_head_ce_bf16) lm_head_ce_bf16 = nullptr;  // loss.h

  // Names of the members left null ("alloc", "attention_fwd", ...); empty for a complete table.
  std::vector<std::string> missing() const;
};

// Adds a backend under (b.device, b.dtype). Throws titan::Error for an incomplete table (naming
// the missing entries) or a pair registered twice.
void register_backend(const Backend& b);

// The backend registered for (device, dtype); built-ins included. Throws titan::Error naming the
// registered pairs when there is none ("no backend for cuda/bfloat16; registered: cpu/float32").
// The reference stays valid for the process.
const Backend& backend(const std::string& device, const std::string& dtype);

// "device/dtype" of every registered backend, sorted.
std::vector<std::string> registered_backends();

// The CPU fp32 kernels (ops/cpu/). Registered as a built-in by builtin_backends().
Backend cpu_backend();
// cpu_backend() with the mixed-precision members and attention_fwd/bwd = attention_*_bf16
// (workspace: attention_bf16_workspace), under dtype "bfloat16" (oneDNN bf16 matmul where the CPU
// has AVX512-BF16 or AMX, the converting path otherwise; see gemm.h).
Backend cpu_bf16_backend();

// The backends titan has built in (src/titan/builtins.cpp, the one place that lists them),
// registered before the first lookup.
std::vector<Backend> builtin_backends();

}  // namespace titan::ops
