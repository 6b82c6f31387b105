// MoE router kernels; see router.h for what they compute and the shapes.
#include "titan/ops/router.h"

#include <cmath>
#include <vector>

namespace titan::ops {
namespace {

// The K largest of v[e] (+ bias[e]) in descending order, ties to the lower index. K passes of a
// max scan: K ≤ 8 and E ≤ 128 in every Qwen3 flavor.
void topk_one(const float* v, const float* bias, int64_t E, int64_t K, int32_t* out) {
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    float bv = 0;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= out[i] == e;
      if (taken) continue;
      const float x = bias ? v[e] + bias[e] : v[e];
      if (best < 0 || x > bv) {
        best = e;
        bv = x;
      }
    }
    out[j] = static_cast<int32_t>(best);
  }
}

}  // namespace

void router_fwd(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K, bool norm,
                float* p, int32_t* idx, float* w) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    float* pt = p + t * E;
    float m = z[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, z[e]);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) {
      pt[e] = std::exp(z[e] - m);
      s += pt[e];
    }
    const float inv = static_cast<float>(1.0 / s);
    for (int64_t e = 0; e < E; ++e) pt[e] *= inv;
    int32_t* it = idx + t * K;
    topk_one(pt, bias, E, K, it);
    float* wt = w + t * K;
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) {
      wt[j] = pt[it[j]];
      sum += wt[j];
    }
    if (norm)
      for (int64_t j = 0; j < K; ++j) wt[j] /= sum;
  }
}

void router_bwd(const float* p, const int32_t* idx, const float* w, const float* dw,
                const float* dp_extra, int64_t T, int64_t E, int64_t K, bool norm, float* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* pt = p + t * E;
    const int32_t* it = idx + t * K;
    const float* wt = w + t * K;
    const float* gt = dw + t * K;
    float* dz = dlogits + t * E;
    // dp (held in dz): the routing weights' share, then the dense extra term.
    for (int64_t e = 0; e < E; ++e) dz[e] = dp_extra ? dp_extra[e] : 0.0f;
    if (norm) {
      // w_j = p_j / S, S = Σ_i p_i (selected):  ∂L/∂p_i = (dw_i − Σ_j dw_j w_j) / S
      float s = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j) {
        s += pt[it[j]];
        dot += gt[j] * wt[j];
      }
      for (int64_t j = 0; j < K; ++j) dz[it[j]] += (gt[j] - dot) / s;
    } else {
      for (int64_t j = 0; j < K; ++j) dz[it[j]] += gt[j];
    }
    // softmax backward: dz = p ⊙ (dp − Σ_e dp_e p_e)
    double c = 0;
    for (int64_t e = 0; e < E; ++e) c += static_cast<double>(dz[e]) * pt[e];
    const float cf = static_cast<float>(c);
    for (int64_t e = 0; e < E; ++e) dz[e] = pt[e] * (dz[e] - cf);
  }
}

void topk_rows(const float* p, int64_t T, int64_t E, int64_t K, int32_t* idx) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) topk_one(p + t * E, nullptr, E, K, idx + t * K);
}

void count_experts(const int32_t* idx, int64_t T, int64_t K, int64_t E, double* counts) {
  std::vector<int64_t> c(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < T * K; ++i) ++c[static_cast<size_t>(idx[i])];
  for (int64_t e = 0; e < E; ++e) counts[e] += static_cast<double>(c[static_cast<size_t>(e)]);
}

void router_aux_stats(const float* p, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                      double* hits, double* psum) {
  count_experts(idx, T, K, E, hits);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) psum[e] += p[t * E + e];
}

void expert_bias_update(const double* load, int64_t E, double coeff, float* bias) {
  // torchtitan: delta = coeff·sign(mean(c) − c); delta −= mean(delta); bias += delta (fp32)
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += load[e];
  mean /= static_cast<double>(E);
  std::vector<float> delta(static_cast<size_t>(E));
  float dmean = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double diff = mean - load[e];
    delta[static_cast<size_t>(e)] =
        static_cast<float>(coeff) * static_cast<float>((diff > 0) - (diff < 0));
    dmean += delta[static_cast<size_t>(e)];
  }
  dmean /= static_cast<float>(E);
  for (int64_t e = 0; e < E; ++e) bias[e] += delta[static_cast<size_t>(e)] - dmean;
}

}  // namespace titan::ops
