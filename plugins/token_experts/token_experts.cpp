// Example plugin: a grouped-experts kernel of its own (forward and backward) attached to the MoE
// layers through an override — where the seed's NKI kernel for Trainium, or a CUDA kernel,
// attaches to titan. It computes what ops/experts_op.h specifies, token by token:
//
//   forward:  for each token t and slot j (e = idx[t,j]):
//               a = W1[e]·x[t], b = W3[e]·x[t] (F each), g = silu(a) ⊙ b,
//               y[t] += w[t,j] · W2[e]·g                      x[T,D], w1/w3[E,F,D], w2[E,D,F]
//             saving a, b (per (t,j): 2F floats) for the backward.
//   backward: differentiates forward: yp = W2[e]·g is recomputed; dw[t,j] = dy[t]·yp;
//             dg = w[t,j]·W2[e]ᵀ·dy[t]; da = dg ⊙ b ⊙ silu'(a), db = dg ⊙ silu(a);
//             dx[t] = Σ_j (W1[e]ᵀ·da + W3[e]ᵀ·db);  dW2[e] += w·dy ⊗ g, dW1[e] += da ⊗ x,
//             dW3[e] += db ⊗ x. Weight gradients are reduced per expert (one thread per expert),
//             dx per token in slot order: deterministic.
// It registers the op "token_experts" twice: for float32, and for bfloat16 (bf16 mixed precision:
// the weights read from the bf16 copies in ExpertsArgs::w*_bf16, every product's activation
// operand rounded to bf16, fp32 accumulation), the module config type TokenExperts.Config (an
// Experts.Config) and the override "token_experts": an exact override of the built-in
// GroupedExperts.Config on every MoE layer. Compare it with the reference before training:
//   titan check-kernel --config qwen3_debugmodel_moe --override.imports libtitan_token_experts.so
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "titan/plugin/plugin_api.h"

namespace {

using titan::ops::ExpertsArgs;
using titan::ops::ExpertsGrads;
using titan::ops::ExpertsShape;

float silu(float a) { return a / (1.0f + std::exp(-a)); }

// bf16 bits -> float (exact), and float rounded to bf16 precision (nearest even; the inputs here
// are finite).
float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return widen(static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

// A weight matrix as the kernel reads it: the fp32 master, or its bf16 copy.
template <bool BF16>
struct Mat {
  const float* f;
  const uint16_t* h;
  float operator[](int64_t i) const {
    if constexpr (BF16)
      return widen(h[i]);
    else
      return f[i];
  }
};
// The activation operand of a product: rounded to bf16 in the bf16 kernel.
template <bool BF16>
float act(float x) {
  if constexpr (BF16)
    return round_bf16(x);
  else
    return x;
}

// y[r] = Σ_c M[r,c]·v[c] for M [R,C]
template <bool BF16>
void matvec(Mat<BF16> M, const float* v, int64_t R, int64_t C, float* y) {
  for (int64_t r = 0; r < R; ++r) {
    float s = 0;
    for (int64_t c = 0; c < C; ++c) s += M[r * C + c] * act<BF16>(v[c]);
    y[r] = s;
  }
}

// y[c] += Σ_r M[r,c]·v[r]
template <bool BF16>
void matvec_t_acc(Mat<BF16> M, const float* v, int64_t R, int64_t C, float* y) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) y[c] += M[r * C + c] * act<BF16>(v[r]);
}

template <bool BF16>
Mat<BF16> w1_of(const ExpertsArgs& a, int64_t e) {
  const int64_t n = e * a.s.F * a.s.D;
  return {a.w1 + n, BF16 ? a.w1_bf16 + n : nullptr};
}
template <bool BF16>
Mat<BF16> w3_of(const ExpertsArgs& a, int64_t e) {
  const int64_t n = e * a.s.F * a.s.D;
  return {a.w3 + n, BF16 ? a.w3_bf16 + n : nullptr};
}
template <bool BF16>
Mat<BF16> w2_of(const ExpertsArgs& a, int64_t e) {
  const int64_t n = e * a.s.D * a.s.F;
  return {a.w2 + n, BF16 ? a.w2_bf16 + n : nullptr};
}

template <bool BF16>
void forward(const ExpertsArgs& a, float* y) {
  const ExpertsShape& s = a.s;
  const int64_t D = s.D, F = s.F, K = s.K;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.T; ++t) {
    std::vector<float> g(F), yp(D);
    for (int64_t c = 0; c < D; ++c) y[t * D + c] = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = a.idx[t * K + j];
      float* ab = a.saved + (t * K + j) * 2 * F;  // a | b
      matvec(w1_of<BF16>(a, e), a.x + t * D, F, D, ab);
      matvec(w3_of<BF16>(a, e), a.x + t * D, F, D, ab + F);
      for (int64_t f = 0; f < F; ++f) g[f] = silu(ab[f]) * ab[F + f];
      matvec(w2_of<BF16>(a, e), g.data(), D, F, yp.data());
      for (int64_t c = 0; c < D; ++c) y[t * D + c] += a.w[t * K + j] * yp[c];
    }
  }
}

template <bool BF16>
void backward(const ExpertsArgs& a, const ExpertsGrads& gr) {
  const ExpertsShape& s = a.s;
  const int64_t T = s.T, D = s.D, F = s.F, K = s.K, E = s.E;
  float* dab = a.scratch;  // [T·K, 2F]: da | db per (t, j)
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> g(F), yp(D), dg(F);
    const float* dy = gr.dy + t * D;
    for (int64_t c = 0; c < D; ++c) gr.dx[t * D + c] = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = a.idx[t * K + j];
      const float wt = a.w[t * K + j];
      const float* ab = a.saved + (t * K + j) * 2 * F;
      for (int64_t f = 0; f < F; ++f) g[f] = silu(ab[f]) * ab[F + f];
      matvec(w2_of<BF16>(a, e), g.data(), D, F, yp.data());
      float dwt = 0;
      for (int64_t c = 0; c < D; ++c) dwt += dy[c] * yp[c];
      gr.dw[t * K + j] = dwt;
      std::fill(dg.begin(), dg.end(), 0.0f);
      matvec_t_acc(w2_of<BF16>(a, e), dy, D, F, dg.data());
      float* d = dab + (t * K + j) * 2 * F;
      for (int64_t f = 0; f < F; ++f) {
        const float av = ab[f], sg = 1.0f / (1.0f + std::exp(-av));
        const float dgf = wt * dg[f];
        d[f] = dgf * ab[F + f] * sg * (1.0f + av * (1.0f - sg));  // silu'(a) = σ(1 + a(1 − σ))
        d[F + f] = dgf * av * sg;
      }
      matvec_t_acc(w1_of<BF16>(a, e), d, F, D, gr.dx + t * D);
      matvec_t_acc(w3_of<BF16>(a, e), d + F, F, D, gr.dx + t * D);
    }
  }
  // Weight gradients: one expert per thread, its tokens in order.
#pragma omp parallel for schedule(dynamic)
  for (int64_t e = 0; e < E; ++e) {
    std::vector<float> g(F);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        if (a.idx[t * K + j] != e || !gr.dw1) continue;  // null: frozen experts (LoRA base)
        const float* ab = a.saved + (t * K + j) * 2 * F;
        const float* d = dab + (t * K + j) * 2 * F;
        const float wt = a.w[t * K + j];
        for (int64_t f = 0; f < F; ++f) g[f] = silu(ab[f]) * ab[F + f];
        for (int64_t c = 0; c < D; ++c)
          for (int64_t f = 0; f < F; ++f)
            gr.dw2[(e * D + c) * F + f] += act<BF16>(gr.dy[t * D + c]) * act<BF16>(wt * g[f]);
        for (int64_t f = 0; f < F; ++f)
          for (int64_t c = 0; c < D; ++c) {
            gr.dw1[(e * F + f) * D + c] += act<BF16>(d[f]) * act<BF16>(a.x[t * D + c]);
            gr.dw3[(e * F + f) * D + c] += act<BF16>(d[F + f]) * act<BF16>(a.x[t * D + c]);
          }
      }
  }
}

}  // namespace

extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }

extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  titan::ops::GroupedExpertsOp op;
  op.name = "token_experts";
  op.saved_floats = [](const ExpertsShape& s) { return s.T * s.K * 2 * s.F; };
  op.scratch_floats = [](const ExpertsShape& s) { return s.T * s.K * 2 * s.F; };
  op.forward = forward<false>;
  op.backward = backward<false>;
  host->add_op(op);
  op.dtype = "bfloat16";  // the same kernel on the bf16 weight copies, bf16 activation operands
  op.forward = forward<true>;
  op.backward = backward<true>;
  host->add_op(op);

  host->add_module_type({"TokenExperts.Config",
                         {"Experts.Config"},
                         {{"op", "token_experts"},
                          {"num_experts", "0"},
                          {"top_k", "0"},
                          {"dim", "0"},
                          {"hidden_dim", "0"}}});
  titan::plugin::Override ov;
  ov.name = "token_experts";
  ov.target = "GroupedExperts.Config";
  ov.exact = true;
  ov.description = "MoE experts computed token by token, with their own backward";
  ov.factory = [host](const titan::config::ModuleNode& node) {
    return titan::config::derive(node, host->module_type("TokenExperts.Config"),
                                 {{"op", "token_experts"}});
  };
  host->add_override(ov);
}
