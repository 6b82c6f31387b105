// The MoE router on the GPU (ops/cuda/cuda_ops.h), router.h's contract and the CPU's order of
// operations: one thread per token for router_fwd / router_bwd / topk_rows (softmax in fp32 with
// a double sum, K max scans with ties to the lower expert), one thread per expert for the
// statistics (counts and Σ_t p[t,e] in order of t: deterministic), one thread for the expert
// bias update.
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

constexpr int kThreads = 128;

__device__ void topk_one(const float* v, const float* bias, int64_t E, int64_t K, int32_t* out) {
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

__global__ void fwd_k(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K,
                      bool norm, float* p, int32_t* idx, float* w) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* z = logits + t * E;
  float* pt = p + t * E;
  float m = z[0];
  for (int64_t e = 1; e < E; ++e) m = fmaxf(m, z[e]);
  double s = 0;
  for (int64_t e = 0; e < E; ++e) {
    pt[e] = expf(z[e] - m);
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

__global__ void bwd_k(const float* p, const int32_t* idx, const float* w, const float* dw,
                      const float* dp_extra, int64_t T, int64_t E, int64_t K, bool norm,
                      float* dlogits) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* pt = p + t * E;
  const int32_t* it = idx + t * K;
  const float* wt = w + t * K;
  const float* gt = dw + t * K;
  float* dz = dlogits + t * E;
  for (int64_t e = 0; e < E; ++e) dz[e] = dp_extra ? dp_extra[e] : 0.0f;
  if (norm) {
    float s = 0, dot = 0;
    for (int64_t j = 0; j < K; ++j) {
      s += pt[it[j]];
      dot += gt[j] * wt[j];
    }
    for (int64_t j = 0; j < K; ++j) dz[it[j]] += (gt[j] - dot) / s;
  } else {
    for (int64_t j = 0; j < K; ++j) dz[it[j]] += gt[j];
  }
  double c = 0;
  for (int64_t e = 0; e < E; ++e) c += static_cast<double>(dz[e]) * pt[e];
  const float cf = static_cast<float>(c);
  for (int64_t e = 0; e < E; ++e) dz[e] = pt[e] * (dz[e] - cf);
}

__global__ void topk_k(const float* p, int64_t T, int64_t E, int64_t K, int32_t* idx) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < T) topk_one(p + t * E, nullptr, E, K, idx + t * K);
}

__global__ void count_k(const int32_t* idx, int64_t n, int64_t E, double* counts) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += idx[i] == e;
  counts[e] += static_cast<double>(c);
}

__global__ void psum_k(const float* p, int64_t T, int64_t E, double* psum) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  double s = psum[e];
  for (int64_t t = 0; t < T; ++t) s += p[t * E + e];
  psum[e] = s;
}

__global__ void bias_k(const double* load, int64_t E, double coeff, float* bias) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += load[e];
  mean /= static_cast<double>(E);
  float dmean = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double diff = mean - load[e];
    dmean += static_cast<float>(coeff) * static_cast<float>((diff > 0) - (diff < 0));
  }
  dmean /= static_cast<float>(E);
  for (int64_t e = 0; e < E; ++e) {
    const double diff = mean - load[e];
    const float delta = static_cast<float>(coeff) * static_cast<float>((diff > 0) - (diff < 0));
    bias[e] += delta - dmean;
  }
}

}  // namespace

void router_fwd(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K, bool norm,
                float* p, int32_t* idx, float* w) {
  if (T <= 0) return;
  fwd_k<<<blocks_for(T, kThreads), kThreads, 0, stream()>>>(logits, bias, T, E, K, norm, p, idx, w);
  TITAN_CUDA_LAUNCHED("router_fwd");
}

void router_bwd(const float* p, const int32_t* idx, const float* w, const float* dw,
                const float* dp_extra, int64_t T, int64_t E, int64_t K, bool norm, float* dlogits) {
  if (T <= 0) return;
  bwd_k<<<blocks_for(T, kThreads), kThreads, 0, stream()>>>(p, idx, w, dw, dp_extra, T, E, K, norm,
                                                            dlogits);
  TITAN_CUDA_LAUNCHED("router_bwd");
}

void topk_rows(const float* p, int64_t T, int64_t E, int64_t K, int32_t* idx) {
  if (T <= 0) return;
  topk_k<<<blocks_for(T, kThreads), kThreads, 0, stream()>>>(p, T, E, K, idx);
  TITAN_CUDA_LAUNCHED("topk_rows");
}

void count_experts(const int32_t* idx, int64_t T, int64_t K, int64_t E, double* counts) {
  count_k<<<blocks_for(E, kThreads), kThreads, 0, stream()>>>(idx, T * K, E, counts);
  TITAN_CUDA_LAUNCHED("count_experts");
}

void router_aux_stats(const float* p, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                      double* hits, double* psum) {
  count_experts(idx, T, K, E, hits);
  psum_k<<<blocks_for(E, kThreads), kThreads, 0, stream()>>>(p, T, E, psum);
  TITAN_CUDA_LAUNCHED("router_aux_stats");
}

void expert_bias_update(const double* load, int64_t E, double coeff, float* bias) {
  bias_k<<<1, 1, 0, stream()>>>(load, E, coeff, bias);
  TITAN_CUDA_LAUNCHED("expert_bias_update");
}

}  // namespace titan::ops::cuda
