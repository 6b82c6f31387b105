// The grouped-experts op: the routed experts of one MoE layer as the model calls them, so that a
// plugin can supply its own kernel pair (as the seed's NKI kernel does for Trainium).
//
//   forward:  y[t] = Σ_{j<K} w[t,j] · W2[e] · ( silu(W1[e]·x[t]) ⊙ W3[e]·x[t] ),  e = idx[t,j]
//             x[T,D], idx[T,K] (int32 in [0,E)), w[T,K] routing weights,
//             w1[E,F,D] (gate), w3[E,F,D] (up), w2[E,D,F] (down); y[T,D] is written.
//   backward: the backward of forward for the same arguments, given dy[T,D]:
//             dx[T,D] and dw[T,K] (∂L/∂w) are written; dw1, dw3, dw2 are accumulated (+=),
//             or all three null: frozen experts (a LoRA base), no weight gradients.
// The forward may leave state for the backward of the same layer in `saved`
// (saved_floats(shape) floats, kept per layer); `scratch` (scratch_floats(shape) floats) is
// shared by all layers. Both sizes are non-decreasing in T, so buffers sized for the largest
// microbatch serve smaller ones. Experts that receive no tokens contribute nothing and get zero
// gradient. check(shape) runs once before training and throws titan::Error for a shape the
// kernel cannot serve.
//
// Ops are registered per (name, device, dtype); see plugin/registry.h.
// Header-only on purpose: plugins build against it without linking titan.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace titan::ops {

struct ExpertsShape {
  int64_t T = 0;  // tokens
  int64_t D = 0;  // model dim
  int64_t F = 0;  // expert hidden dim (moe_intermediate_size)
  int64_t E = 0;  // experts
  int64_t K = 0;  // experts per token (top-k)
};

struct ExpertsArgs {
  ExpertsShape s;
  const float* x = nullptr;
  const int32_t* idx = nullptr;
  const float* w = nullptr;
  const float *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  float* saved = nullptr;
  float* scratch = nullptr;
  // The bf16 compute copies of w1, w3, w2 (raw bf16 bits, same layout) in a mixed-precision run;
  // null in fp32. An op registered under dtype "bfloat16" multiplies with these.
  const uint16_t *w1_bf16 = nullptr, *w3_bf16 = nullptr, *w2_bf16 = nullptr;
};

struct ExpertsGrads {
  const float* dy = nullptr;
  float* dx = nullptr;
  float* dw = nullptr;
  float *dw1 = nullptr, *dw3 = nullptr, *dw2 = nullptr;
};

struct GroupedExpertsOp {
  static constexpr const char* kKind = "experts";  // the op table's kind (plugin/registry.h)
  std::string name;
  std::string device = "cpu";
  std::string dtype = "float32";
  std::function<int64_t(const ExpertsShape&)> saved_floats, scratch_floats;
  std::function<void(const ExpertsArgs&, float* y)> forward;
  std::function<void(const ExpertsArgs&, const ExpertsGrads&)> backward;
  std::function<void(const ExpertsShape&)> check;  // optional
};

// The built-in kernels: "grouped_experts" (tokens permuted so each expert's rows are contiguous,
// one oneDNN GEMM per expert and projection, deterministic combine) and
// "grouped_experts_reference" (a plain loop over experts and tokens, for tests and
// check-kernel). grouped_experts_bf16_op() is "grouped_experts" under dtype "bfloat16": the same
// algorithm with every GEMM's activation operand rounded to bf16 and the bf16 weight copies
// (fp32 accumulation; routing weights, SwiGLU and the combine in fp32).
GroupedExpertsOp grouped_experts_op();
GroupedExpertsOp grouped_experts_bf16_op();
GroupedExpertsOp grouped_experts_reference_op();

}  // namespace titan::ops
