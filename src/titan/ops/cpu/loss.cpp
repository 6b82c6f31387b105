#include "titan/ops/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

void check_labels(const int32_t* labels, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t)
    check(labels[t] == kIgnoreIndex || (labels[t] >= 0 && labels[t] < V),
          "label " + std::to_string(labels[t]) + " at position " + std::to_string(t) +
              " is outside the vocabulary [0, " + std::to_string(V) + ") and is not -100");
}

// lm_head_ce for fp32 weights (W = float) or the bf16 compute copy (W = uint16_t: each chunk's
// h and logit gradient are rounded to bf16 for the GEMMs; the CE itself is fp32).
template <typename W>
LossSum lm_head_ce_impl(const float* h, const W* w, const int32_t* labels, int64_t T, int64_t D,
                        int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                        float* scratch) {
  constexpr bool bf16 = std::is_same_v<W, uint16_t>;
  check_labels(labels, T, V);
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

LossSum lm_head_ce_vocab_parallel(const float* h, const float* w, const uint16_t* w_bf16,
                                  const int32_t* labels, int64_t T, int64_t D, int64_t V,
                                  int64_t v0, int64_t Vr, int64_t chunk_rows, float grad_scale,
                                  float* dh, float* dw, float* scratch, RankReducer& red) {
  check_labels(labels, T, V);
  const bool grad = grad_scale != 0.0f && dh != nullptr;
  const int64_t rows = std::min(T, chunk_rows);
  float* z = scratch;
  float* mx = z + rows * Vr;
  float* sum = mx + rows;  // then the target logits: one reduction for both
  uint16_t* zb = reinterpret_cast<uint16_t*>(sum + 2 * rows);
  uint16_t* hb = zb + rows * Vr;
  LossSum r;
  for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, T - t0);
    float* zt = sum + n;
    if (Vr > 0) {
      if (w_bf16) {
        to_bf16(h + t0 * D, n * D, hb);
        gemm_bf16(false, true, n, Vr, D, hb, D, w_bf16, D, z, Vr, false);
      } else {
        gemm(false, true, n, Vr, D, h + t0 * D, D, w, D, z, Vr, false);
      }
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* zi = z + i * Vr;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Vr; ++j) m = std::max(m, zi[j]);
      mx[i] = m;
    }
    red.max(mx, n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* zi = z + i * Vr;
      float s = 0.f;
      for (int64_t j = 0; j < Vr; ++j) s += exp_fast(zi[j] - mx[i]);
      sum[i] = s;
      const int32_t lab = labels[t0 + i];
      zt[i] = lab >= v0 && lab < v0 + Vr ? zi[lab - v0] : 0.f;
    }
    red.sum(sum, 2 * n);
    for (int64_t i = 0; i < n; ++i) {
      if (labels[t0 + i] == kIgnoreIndex) continue;
      r.sum += static_cast<double>(mx[i] + std::log(sum[i]) - zt[i]);
      ++r.count;
    }
    if (!grad) continue;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* zi = z + i * Vr;
      const int32_t lab = labels[t0 + i];
      if (lab == kIgnoreIndex) {
        std::fill_n(zi, Vr, 0.f);
        continue;
      }
      const float lse = mx[i] + std::log(sum[i]);
      for (int64_t j = 0; j < Vr; ++j) zi[j] = exp_fast(zi[j] - lse) * grad_scale;
      if (lab >= v0 && lab < v0 + Vr) zi[lab - v0] -= grad_scale;
    }
    float* dht = dh + t0 * D;
    if (Vr == 0) {
      std::fill_n(dht, n * D, 0.f);
    } else if (w_bf16) {
      to_bf16(z, n * Vr, zb);
      gemm_bf16(false, false, n, D, Vr, zb, Vr, w_bf16, D, dht, D, false);
      if (dw) gemm_bf16(true, false, Vr, D, n, zb, Vr, hb, D, dw, D, true);
    } else {
      gemm(false, false, n, D, Vr, z, Vr, w, D, dht, D, false);
      if (dw) gemm(true, false, Vr, D, n, z, Vr, h + t0 * D, D, dw, D, true);
    }
  }
  return r;
}

}  // namespace titan::ops
