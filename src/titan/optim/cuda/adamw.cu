// AdamW and the gradient norm on the GPU (optim/cuda/adamw.h), optim/adamw.h's contract:
//   adamw_step     p ← p·(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2·v + (1−β2)·g²;
//                  p ← p − (lr/(1−β1^t))·m/(sqrt(v)/sqrt(1−β2^t) + eps)   one fused pass
//   sum_squares    Σ x² in double: kBlocks fixed blocks (grid-stride), each reduced in a fixed
//                  tree, then the blocks in order by one block: deterministic
//   clip_by_norm   g ← g·min(1, max_norm/(norm + 1e-6))
//   adamw_step_bf16  adamw_step with bf16 moments, stochastically rounded (adamw_math.h: the
//                  per-element maths shared with the CPU)
//   adamw_step_q8  adamw_step with 8-bit moments (optim/adamw.h adamw_step_q8): one thread block
//                  of kQ8Block threads per block of the state: decode, update, the block's new
//                  absmax by a shared-memory tree, encode (adamw_math.h q8_encode, the maps in
//                  constant memory)
// Compiled with --fmad=false, as the elementwise ops.
#include <cmath>

#include "titan/ops/cuda/runtime.h"
#include "titan/optim/cuda/adamw.h"

namespace titan::optim::cuda {
using ops::cuda::blocks_for;
using ops::cuda::check_cuda;
using ops::cuda::stream;
using ops::cuda::Temp;
namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 1024;

__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t n, AdamWConsts c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, g[i], mi, vi, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void adamw_bf16_k(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                             AdamWConsts c, uint64_t key) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = bf16_to_float(m[i]), vi = bf16_to_float(v[i]);
    adamw_element(pi, g[i], mi, vi, c);
    const uint32_t r = sr_bits(key, static_cast<uint64_t>(i));
    p[i] = pi;
    m[i] = bf16_stochastic(mi, r);
    v[i] = bf16_stochastic(vi, r >> 16);
  }
}

__constant__ float c_q8_maps[2][256];  // q8_map(true), q8_map(false)

__device__ float block_max_f32(float v) {
  __shared__ float s[kQ8Block];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kQ8Block / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] = fmaxf(s[threadIdx.x], s[threadIdx.x + w]);
    __syncthreads();
  }
  const float top = s[0];
  __syncthreads();
  return top;
}

// blockDim.x == kQ8Block; block b of the state is thread block b.
__global__ void adamw_q8_k(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                           float* absmax_v, const int64_t* begin, AdamWConsts c) {
  const int64_t b = blockIdx.x, i = begin[b] + threadIdx.x;
  const bool live = i < begin[b + 1];
  const float* map_m = c_q8_maps[0];
  const float* map_v = c_q8_maps[1];
  float mi = 0, vi = 0;
  if (live) {
    float pi = p[i];
    mi = map_m[m[i]] * absmax_m[b];
    vi = map_v[v[i]] * absmax_v[b];
    adamw_element(pi, g[i], mi, vi, c);
    p[i] = pi;
  }
  const float top_m = block_max_f32(fabsf(mi)), top_v = block_max_f32(fabsf(vi));
  if (live) {
    q8_encode_block(&mi, 1, top_m, map_m, m + i);
    q8_encode_block(&vi, 1, top_v, map_v, v + i);
  }
  if (threadIdx.x == 0) {
    absmax_m[b] = top_m;
    absmax_v[b] = top_v;
  }
}

__device__ double block_sum_f64(double v) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

__global__ void sq_blocks(const float* x, int64_t n, double* parts) {
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc += static_cast<double>(x[i]) * x[i];
  const double s = block_sum_f64(acc);
  if (threadIdx.x == 0) parts[blockIdx.x] = s;
}

__global__ void sum_parts(const double* parts, int n, double* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0;
  for (int i = 0; i < n; ++i) s += parts[i];
  *out = s;
}

__global__ void scale_k(float* g, int64_t n, float c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[i] *= c;
}

unsigned grid(int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

}  // namespace

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n,
                const optim::AdamWConfig& c, float lr, int64_t step) {
  if (n <= 0) return;
  // The scalars exactly as optim::adamw_step forms them (double, then rounded to float).
  adamw_k<<<grid(n), kThreads, 0, stream()>>>(p, g, m, v, n, adamw_consts(c, lr, step));
  TITAN_CUDA_LAUNCHED("adamw_step");
}

void adamw_step_bf16(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                     const AdamWConfig& c, float lr, int64_t step, uint64_t key) {
  if (n <= 0) return;
  adamw_bf16_k<<<grid(n), kThreads, 0, stream()>>>(p, g, m, v, n, adamw_consts(c, lr, step), key);
  TITAN_CUDA_LAUNCHED("adamw_step_bf16");
}

void adamw_step_q8(float* p, const float* g, uint8_t* m, uint8_t* v, float* absmax_m,
                   float* absmax_v, const int64_t* begin, int64_t nblocks, const AdamWConfig& c,
                   float lr, int64_t step) {
  if (nblocks <= 0) return;
  static const bool maps = [] {  // once per process, before the first launch
    float host[2][256];
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < 256; ++k) host[s][k] = q8_map(s == 0)[k];
    TITAN_CUDA_CHECK(cudaMemcpyToSymbol(c_q8_maps, host, sizeof host));
    return true;
  }();
  (void)maps;
  adamw_q8_k<<<static_cast<unsigned>(nblocks), kQ8Block, 0, stream()>>>(
      p, g, m, v, absmax_m, absmax_v, begin, adamw_consts(c, lr, step));
  TITAN_CUDA_LAUNCHED("adamw_step_q8");
}

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0;
  Temp<double> parts(kBlocks + 1);
  sq_blocks<<<kBlocks, kThreads, 0, stream()>>>(x, n, parts.get());
  TITAN_CUDA_LAUNCHED("sum_squares");
  sum_parts<<<1, 1, 0, stream()>>>(parts.get(), kBlocks, parts.get() + kBlocks);
  TITAN_CUDA_LAUNCHED("sum_squares (blocks)");
  double out = 0;
  TITAN_CUDA_CHECK(
      cudaMemcpyAsync(&out, parts.get() + kBlocks, sizeof out, cudaMemcpyDeviceToHost, stream()));
  TITAN_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return out;
}

void clip_by_norm(float* g, int64_t n, double norm, double max_norm) {
  const double coef = std::min(1.0, max_norm / (norm + 1e-6));
  if (coef >= 1.0 || n <= 0) return;
  scale_k<<<grid(n), kThreads, 0, stream()>>>(g, n, static_cast<float>(coef));
  TITAN_CUDA_LAUNCHED("clip_by_norm");
}

}  // namespace titan::optim::cuda
