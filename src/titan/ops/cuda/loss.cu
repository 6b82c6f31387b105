// lm_head + cross-entropy on the GPU (ops/cuda/cuda_ops.h), loss.h's contract: per chunk of at
// most chunk_rows tokens, logits = h·wᵀ (cuBLASLt), then one block per row: max, Σ exp, lse,
// ce = lse − z[label]; with a gradient the row becomes grad_scale·(softmax − onehot) and
// dh = g·w, dw += gᵀ·h (bf16: h and g rounded to bf16 for the GEMMs, as the CPU's
// lm_head_ce_bf16). The scratch layout is the CPU's (logits of a chunk, then ce[T], then the
// bf16 copies); the per-row ce values are summed in double in token order by one device thread,
// as the CPU sums them, and only the sum and count are read back.
#include <cmath>
#include <vector>

#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row r of the chunk starting at token t0.
__global__ void ce_rows(float* logits, int64_t V, const int32_t* labels, int64_t t0, float scale,
                        bool grad, float* ce) {
  const int64_t r = blockIdx.x;
  float* z = logits + r * V;
  const int32_t label = labels[t0 + r];
  if (label == kIgnoreIndex) {
    if (threadIdx.x == 0) ce[t0 + r] = 0.0f;
    if (grad)
      for (int64_t k = threadIdx.x; k < V; k += blockDim.x) z[k] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int64_t k = threadIdx.x; k < V; k += blockDim.x) mx = fmaxf(mx, z[k]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < V; k += blockDim.x) sum += expf(z[k] - mx);
  sum = block_sum(sum);
  const float lse = mx + logf(sum);
  if (threadIdx.x == 0) ce[t0 + r] = lse - z[label];
  __syncthreads();  // z[label] read before the gradient overwrites it
  if (grad)
    for (int64_t k = threadIdx.x; k < V; k += blockDim.x)
      z[k] = expf(z[k] - lse) * scale - (k == label ? scale : 0.0f);
}

// out = {Σ ce[t] over valid labels in token order (double, as the CPU sums), their count}.
__global__ void sum_valid_k(const float* ce, const int32_t* labels, int64_t T, double* out) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t)
    if (labels[t] != kIgnoreIndex) {
      sum += ce[t];
      ++count;
    }
  out[0] = sum;
  out[1] = static_cast<double>(count);
}

// Every label in [0, V) or -100, checked on the device; the first bad one named.
void check_labels(const int32_t* labels, int64_t T, int64_t V) {
  int32_t label = 0;
  const int64_t bad = first_outside(labels, T, 0, V, kIgnoreIndex, &label);
  if (bad >= 0)
    throw Error("label " + std::to_string(label) + " at position " + std::to_string(bad) +
                " is outside the vocabulary [0, " + std::to_string(V) + ") and is not -100");
}

template <bool BF16, typename W>
LossSum lm_head(const float* h, const W* w, const int32_t* labels, int64_t T, int64_t D, int64_t V,
                int64_t chunk_rows, float grad_scale, float* dh, float* dw, float* scratch) {
  LossSum r;
  if (T <= 0) return r;
  check_labels(labels, T, V);
  const bool grad = grad_scale != 0.0f && dh != nullptr;
  const int64_t rows = T < chunk_rows ? T : chunk_rows;
  float* logits = scratch;
  float* ce = scratch + rows * V;
  uint16_t* zb = reinterpret_cast<uint16_t*>(ce + T);  // bf16: the logit gradient, then h
  uint16_t* hb = zb + rows * V;
  for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
    const int64_t n = chunk_rows < T - t0 ? chunk_rows : T - t0;
    if constexpr (BF16) {
      to_bf16(h + t0 * D, n * D, hb);
      gemm_bf16(false, true, n, V, D, hb, D, w, D, logits, V, false);
    } else {
      gemm(false, true, n, V, D, h + t0 * D, D, w, D, logits, V, false);
    }
    ce_rows<<<static_cast<unsigned>(n), kThreads, 0, stream()>>>(logits, V, labels, t0, grad_scale,
                                                                 grad, ce);
    TITAN_CUDA_LAUNCHED("lm_head_ce (rows)");
    if (!grad) continue;
    if constexpr (BF16) {
      to_bf16(logits, n * V, zb);
      gemm_bf16(false, false, n, D, V, zb, V, w, D, dh + t0 * D, D, false);
      if (dw) gemm_bf16(true, false, V, D, n, zb, V, hb, D, dw, D, true);
    } else {
      gemm(false, false, n, D, V, logits, V, w, D, dh + t0 * D, D, false);
      if (dw) gemm(true, false, V, D, n, logits, V, h + t0 * D, D, dw, D, true);
    }
  }
  Temp<double> total(2);
  sum_valid_k<<<1, 1, 0, stream()>>>(ce, labels, T, total.get());
  TITAN_CUDA_LAUNCHED("lm_head_ce (sum)");
  double host[2];
  TITAN_CUDA_CHECK(
      cudaMemcpyAsync(host, total.get(), sizeof host, cudaMemcpyDeviceToHost, stream()));
  TITAN_CUDA_CHECK(cudaStreamSynchronize(stream()));
  r.sum = host[0];
  r.count = static_cast<int64_t>(host[1]);
  return r;
}

// Per row i of a chunk's logits z[n, Vr]: mx[i] = max_j z[i, j].
__global__ void row_max_k(const float* z, int64_t Vr, float* mx) {
  const int64_t i = blockIdx.x;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < Vr; j += blockDim.x) m = fmaxf(m, z[i * Vr + j]);
  m = block_max(m);
  if (threadIdx.x == 0) mx[i] = m;
}

// sum[i] = Σ_j exp(z[i, j] − mx[i]); zt[i] = z[i, label − v0] where this rank holds the label.
__global__ void row_sum_target_k(const float* z, int64_t Vr, const float* mx, const int32_t* labels,
                                 int64_t v0, float* sum, float* zt) {
  const int64_t i = blockIdx.x;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < Vr; j += blockDim.x) s += expf(z[i * Vr + j] - mx[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sum[i] = s;
    const int64_t lab = labels[i];
    zt[i] = lab >= v0 && lab < v0 + Vr ? z[i * Vr + lab - v0] : 0.0f;
  }
}

// The logit gradient of this rank's columns: scale·(softmax − onehot), zeros on ignored rows.
__global__ void row_grad_k(float* z, int64_t Vr, const float* mx, const float* sum,
                           const int32_t* labels, int64_t v0, float scale) {
  const int64_t i = blockIdx.x;
  const int32_t lab = labels[i];
  const float lse = mx[i] + logf(sum[i]);
  for (int64_t j = threadIdx.x; j < Vr; j += blockDim.x)
    z[i * Vr + j] = lab == kIgnoreIndex
                        ? 0.0f
                        : expf(z[i * Vr + j] - lse) * scale - (v0 + j == lab ? scale : 0.0f);
}

}  // namespace

// loss.h's lm_head_ce_vocab_parallel on the GPU: the CPU's steps per chunk (the logits of this
// rank's rows, the max and the Σ exp / target logit reduced over the group through `red` on
// device memory, the gradient, the GEMMs); each chunk's max, Σ exp, target logits and labels are
// read back and the CEs summed on the host in token order, as the CPU sums them.
LossSum lm_head_ce_vocab_parallel(const float* h, const float* w, const uint16_t* w_bf16,
                                  const int32_t* labels, int64_t T, int64_t D, int64_t V,
                                  int64_t v0, int64_t Vr, int64_t chunk_rows, float grad_scale,
                                  float* dh, float* dw, float* scratch, RankReducer& red) {
  LossSum r;
  if (T <= 0) return r;
  check_labels(labels, T, V);
  const bool grad = grad_scale != 0.0f && dh != nullptr;
  const int64_t rows = T < chunk_rows ? T : chunk_rows;
  float* z = scratch;  // the CPU op's layout
  float* mx = z + rows * Vr;
  float* sum = mx + rows;
  uint16_t* zb = reinterpret_cast<uint16_t*>(sum + 2 * rows);
  uint16_t* hb = zb + rows * Vr;
  std::vector<float> host(static_cast<size_t>(3 * rows));
  std::vector<int32_t> lab(static_cast<size_t>(rows));
  for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
    const int64_t n = chunk_rows < T - t0 ? chunk_rows : T - t0;
    float* zt = sum + n;
    const unsigned blocks = static_cast<unsigned>(n);
    if (Vr > 0) {
      if (w_bf16) {
        to_bf16(h + t0 * D, n * D, hb);
        gemm_bf16(false, true, n, Vr, D, hb, D, w_bf16, D, z, Vr, false);
      } else {
        gemm(false, true, n, Vr, D, h + t0 * D, D, w, D, z, Vr, false);
      }
    }
    row_max_k<<<blocks, kThreads, 0, stream()>>>(z, Vr, mx);
    TITAN_CUDA_LAUNCHED("lm_head_ce_vocab_parallel (max)");
    red.max(mx, n);
    row_sum_target_k<<<blocks, kThreads, 0, stream()>>>(z, Vr, mx, labels + t0, v0, sum, zt);
    TITAN_CUDA_LAUNCHED("lm_head_ce_vocab_parallel (sum)");
    red.sum(sum, 2 * n);
    copy(host.data(), mx, sizeof(float) * static_cast<size_t>(n));           // mx[n] (of rows)
    copy(host.data() + n, sum, sizeof(float) * static_cast<size_t>(2 * n));  // sum | zt
    copy(lab.data(), labels + t0, sizeof(int32_t) * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (lab[static_cast<size_t>(i)] == kIgnoreIndex) continue;
      r.sum += static_cast<double>(host[static_cast<size_t>(i)] +
                                   std::log(host[static_cast<size_t>(n + i)]) -
                                   host[static_cast<size_t>(2 * n + i)]);
      ++r.count;
    }
    if (!grad) continue;
    float* dht = dh + t0 * D;
    if (Vr == 0) {
      TITAN_CUDA_CHECK(
          cudaMemsetAsync(dht, 0, sizeof(float) * static_cast<size_t>(n * D), stream()));
      continue;
    }
    row_grad_k<<<blocks, kThreads, 0, stream()>>>(z, Vr, mx, sum, labels + t0, v0, grad_scale);
    TITAN_CUDA_LAUNCHED("lm_head_ce_vocab_parallel (gradient)");
    if (w_bf16) {
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

LossSum lm_head_ce(const float* h, const float* w, const int32_t* labels, int64_t T, int64_t D,
                   int64_t V, int64_t chunk_rows, float grad_scale, float* dh, float* dw,
                   float* scratch) {
  return lm_head<false>(h, w, labels, T, D, V, chunk_rows, grad_scale, dh, dw, scratch);
}

LossSum lm_head_ce_bf16(const float* h, const uint16_t* w, const int32_t* labels, int64_t T,
                        int64_t D, int64_t V, int64_t chunk_rows, float grad_scale, float* dh,
                        float* dw, float* scratch) {
  return lm_head<true>(h, w, labels, T, D, V, chunk_rows, grad_scale, dh, dw, scratch);
}

}  // namespace titan::ops::cuda
