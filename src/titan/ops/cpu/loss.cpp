#include "titan/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "titan/core/error.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/gemm.h"
#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

// Turns one logits row into its CE value; with grad, overwrites it with d ce / d logits · scale.
TITAN_CLONES float ce_row(float* z, int64_t V, int32_t label, float scale, bool grad) {
  float mx = z[0];
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, z[j]);
  float acc[16] = {};
  int64_t j = 0;
  for (; j + 16 <= V; j += 16)
    for (int c = 0; c < 16; ++c) acc[c] += exp_fast(z[j + c] - mx);
  float sum = 0.f;
  for (; j < V; ++j) sum += exp_fast(z[j] - mx);
  for (int c = 0; c < 16; ++c) sum += acc[c];
  const float lse = mx + std::log(sum);
  const float ce = lse - z[label];
  if (grad) {
    for (int64_t k = 0; k < V; ++k) z[k] = exp_fast(z[k] - lse) * scale;
    z[label] -= scale;
  }
  return ce;
}

}  // namespace

int64_t lm_head_ce_scratch(int64_t T, int64_t V, int64_t chunk_rows) {
  return std::min(T, chunk_rows) * V + T;
}

int64_t lm_head_ce_bf16_scratch(int64_t T, int64_t V, int64_t D, int64_t chunk_rows) {
  const int64_t n = std::min(T, chunk_rows);
  return lm_head_ce_scratch(T, V, chunk_rows) + (n * V + n * D + 1) / 2;  // + bf16 logits, h
}

namespace {
// lm_head_ce for fp32 weights (W = float) or the bf16 compute copy (W = uint16_t: each chunk's
// h and logit gradient are rounded to bf16 for the GEMMs; the CE itself is fp32).
template <typename W>
LossSum lm_head_ce_impl(const float* h, const W* w, const int32_t* labels, int64_t T, int64_t D,
                        int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                        float* scratch) {
  constexpr bool bf16 = std::is_same_v<W, uint16_t>;
  for (int64_t t = 0; t < T; ++t)
    check(labels[t] == kIgnoreIndex || (labels[t] >= 0 && labels[t] < V),
          "label " + std::to_string(labels[t]) + " at position " + std::to_string(t) +
              " is outside the vocabulary [0, " + std::to_string(V) + ") and is not -100");
  const bool grad = grad_scale != 0.0f && dh != nullptr;
  const int64_t rows = std::min(T, chunk_rows);
  float* logits = scratch;
  float* ce = scratch + rows * V;
  uint16_t* zb = reinterpret_cast<uint16_t*>(ce + T);  // bf16: the logit gradient, then h
  uint16_t* hb = zb + rows * V;
  for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, T - t0);
    if constexpr (bf16) {
      to_bf16(h + t0 * D, n * D, hb);
      gemm_bf16(false, true, n, V, D, hb, D, w, D, logits, V, false);
    } else {
      gemm(false, true, n, V, D, h + t0 * D, D, w, D, logits, V, false);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      float* z = logits + r * V;
      const int32_t lab = labels[t0 + r];
      if (lab == kIgnoreIndex) {
        ce[t0 + r] = 0.f;
        if (grad) std::fill_n(z, V, 0.f);
      } else {
        ce[t0 + r] = ce_row(z, V, lab, grad_scale, grad);
      }
    }
    if (!grad) continue;
    if constexpr (bf16) {
      to_bf16(logits, n * V, zb);
      gemm_bf16(false, false, n, D, V, zb, V, w, D, dh + t0 * D, D, false);
      if (dw) gemm_bf16(true, false, V, D, n, zb, V, hb, D, dw, D, true);
    } else {
      gemm(false, false, n, D, V, logits, V, w, D, dh + t0 * D, D, false);
      if (dw) gemm(true, false, V, D, n, logits, V, h + t0 * D, D, dw, D, true);
    }
  }
  LossSum r;
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreIndex) continue;
    r.sum += ce[t];
    ++r.count;
  }
  return r;
}
}  // namespace

LossSum lm_head_ce(const float* h, const float* w, const int32_t* labels, int64_t T, int64_t D,
                   int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                   float* scratch) {
  return lm_head_ce_impl(h, w, labels, T, D, V, chunk_rows, grad_scale, dh, dw, scratch);
}

LossSum lm_head_ce_bf16(const float* h, const uint16_t* w, const int32_t* labels, int64_t T,
                        int64_t D, int64_t V, int64_t chunk_rows, float grad_scale, float* dh,
                        float* dw, float* scratch) {
  return lm_head_ce_impl(h, w, labels, T, D, V, chunk_rows, grad_scale, dh, dw, scratch);
}

}  // namespace titan::ops
