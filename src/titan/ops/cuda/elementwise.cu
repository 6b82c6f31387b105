// The elementwise ops of elementwise.h on the GPU (ops/cuda/cuda_ops.h), fp32 in and out:
//   embedding_fwd  out[T,D] = table[ids[t], :]                      (ids checked on the device)
//   embedding_bwd  dtable[V,D] += Σ_t dout[t,:] at row ids[t]        (tokens sorted by id,
//                  stably, then each row summed in token order: the CPU's order, no atomics)
//   embedding_fwd_range / embedding_bwd_range: the same over table rows [v0, v0 + vl) only
//   rmsnorm_fwd    y = w ⊙ x·rstd, rstd = 1/sqrt(mean(x²) + eps)     per row of N (T·H rows)
//   rmsnorm_bwd    dx = rstd·(dy⊙w − x̂·mean(dy⊙w⊙x̂)); dw += Σ_rows dy⊙x̂ (backward of
//                  rmsnorm_fwd; dw in 32 fixed row blocks, then the blocks in order, as the CPU)
//   rope_table     cos_sin[max_pos, d]: the CPU's table, built on the host and copied
//   first_bad_position  read back
//   rope_fwd/bwd   rotate halves (x1, x2) of each head by the position's (cos, sin); bwd by −sin
//   swiglu_fwd     g[T,F] = silu(a)·b for ab[T, 2F] = [a | b];  swiglu_bwd its backward
//   add, add_inplace, scale_inplace, copy_rows, sum_rows, dropout / dropout_add (core/rng.h's
//   counter-based masks, the same bits), to_bf16 (round to nearest even; NaN stays a quiet NaN),
//   from_bf16
// Compiled with --fmad=false: each product and sum rounds as on the CPU (elementwise.cpp is
// built with -ffp-contract=off), so only reductions (the norms' sums of squares) differ in order.
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "titan/core/rng.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"
#include "titan/ops/rope_op.h"

namespace titan::ops::cuda {
namespace {

constexpr int kThreads = 256;

// The first t with v[t] outside [lo, hi) and not `allowed`, by atomicMin over the threads.
__global__ void first_outside_k(const int32_t* v, int64_t n, int64_t lo, int64_t hi,
                                int64_t allowed, unsigned long long* first) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (v[t] != allowed && (v[t] < lo || v[t] >= hi))
      atomicMin(first, static_cast<unsigned long long>(t));
}

__global__ void iota_k(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = static_cast<int32_t>(i);
}

// out[t] = table[ids[t] − v0] for ids in [v0, v0 + vl), else zeros.
__global__ void gather_rows(const int32_t* ids, int64_t T, const float* table, int64_t v0,
                            int64_t vl, int64_t D, float* out) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, c = i % D, id = ids[t];
    out[i] = id >= v0 && id < v0 + vl ? table[(id - v0) * D + c] : 0.0f;
  }
}

// The sort keys of the backward: ids[t] − v0 in the range, vl (past every row) elsewhere.
__global__ void range_keys(const int32_t* ids, int64_t T, int64_t v0, int64_t vl, int32_t* keys) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = ids[t];
    keys[t] = static_cast<int32_t>(id >= v0 && id < v0 + vl ? id - v0 : vl);
  }
}

// One block per sorted position that starts a run of equal ids below `limit`: adds the run's
// rows, in token order, to that id's row.
__global__ void scatter_runs(const int32_t* sorted_ids, const int32_t* tokens, int64_t T,
                             int64_t limit, const float* dout, int64_t D, float* dtable) {
  for (int64_t i = blockIdx.x; i < T; i += gridDim.x) {
    const int32_t id = sorted_ids[i];
    if (id >= limit || (i > 0 && sorted_ids[i - 1] == id)) continue;
    int64_t end = i + 1;
    while (end < T && sorted_ids[end] == id) ++end;
    float* dst = dtable + static_cast<int64_t>(id) * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float acc = dst[c];
      for (int64_t j = i; j < end; ++j) acc += dout[static_cast<int64_t>(tokens[j]) * D + c];
      dst[c] = acc;
    }
  }
}

// One block per row r = (t, h).
__global__ void rmsnorm_fwd_rows(NormRows s, const float* x, const float* w, float eps, float* y,
                                 float* rstd) {
  const int64_t r = blockIdx.x, t = r / s.H, h = r % s.H;
  const float* xr = x + t * s.ldx + h * s.N;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < s.N; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(s.N) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  float* yr = y + t * s.ldy + h * s.N;
  for (int64_t i = threadIdx.x; i < s.N; i += blockDim.x) yr[i] = w[i] * (xr[i] * rs);
}

__global__ void rmsnorm_bwd_rows(NormRows s, const float* dy, const float* x, const float* w,
                                 const float* rstd, float* dx) {
  const int64_t r = blockIdx.x, t = r / s.H, h = r % s.H;
  const float* dyr = dy + t * s.ldy + h * s.N;
  const float* xr = x + t * s.ldx + h * s.N;
  const float rs = rstd[r];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < s.N; i += blockDim.x) acc += dyr[i] * w[i] * xr[i];
  acc = block_sum(acc);
  const float c = acc * rs * rs / static_cast<float>(s.N);
  float* dxr = dx + t * s.ldx + h * s.N;
  for (int64_t i = threadIdx.x; i < s.N; i += blockDim.x) dxr[i] = rs * (dyr[i] * w[i] - xr[i] * c);
}

// Block b of nb: its rows' dy⊙x̂ summed in row order into scratch[b, N] (one thread a column).
__global__ void rmsnorm_dw_blocks(NormRows s, const float* dy, const float* x, const float* rstd,
                                  int64_t nb, float* scratch) {
  const int64_t b = blockIdx.y, k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= s.N) return;
  const int64_t rows = s.T * s.H;
  float acc = 0.0f;
  for (int64_t r = rows * b / nb; r < rows * (b + 1) / nb; ++r) {
    const int64_t t = r / s.H, h = r % s.H;
    acc += dy[t * s.ldy + h * s.N + k] * x[t * s.ldx + h * s.N + k] * rstd[r];
  }
  scratch[b * s.N + k] = acc;
}

__global__ void add_blocks(float* dw, const float* scratch, int64_t nb, int64_t N) {
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= N) return;
  float acc = dw[k];
  for (int64_t b = 0; b < nb; ++b) acc = acc + scratch[b * N + k];
  dw[k] = acc;
}

__global__ void rope_rows(float* x, int64_t T, int64_t H, int64_t d, int64_t ldx,
                          const int32_t* positions, const float* cos_sin, float sign) {
  const int64_t half = d / 2, n = T * H * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, th = i / half, h = th % H, t = th / H;
    float* row = x + t * ldx + h * d;
    const float* cs = cos_sin + static_cast<int64_t>(positions[t]) * d;
    const float x1 = row[j], x2 = row[j + half], c = cs[j], sn = sign * cs[half + j];
    row[j] = x1 * c - x2 * sn;
    row[j + half] = x2 * c + x1 * sn;
  }
}

__global__ void swiglu_fwd_k(const float* ab, float* g, int64_t T, int64_t F) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * F;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i % F;
    const float a = ab[t * 2 * F + f], b = ab[t * 2 * F + F + f];
    const float sig = 1.0f / (1.0f + expf(-a));
    g[i] = a * sig * b;
  }
}

__global__ void swiglu_bwd_k(const float* dg, const float* ab, float* dab, int64_t T, int64_t F) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * F;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, f = i % F;
    const float a = ab[t * 2 * F + f], b = ab[t * 2 * F + F + f];
    const float sig = 1.0f / (1.0f + expf(-a));
    dab[t * 2 * F + F + f] = dg[i] * (a * sig);
    dab[t * 2 * F + f] = dg[i] * b * (sig * (1.0f + a * (1.0f - sig)));
  }
}

__global__ void add_k(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void scale_k(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

// core/rng.h's splitmix64 / random_u64 / uniform_open on the device (integer and double
// arithmetic: the same values as the host's).
__device__ uint64_t splitmix64_d(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ bool kept(uint64_t base, uint64_t k, double p) {  // base = splitmix(seed ^ ...)
  const uint64_t bits = splitmix64_d(base + k);
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0) >= p;
}

template <bool Add>
__global__ void dropout_k(const float* x, float* y, int64_t n, uint64_t base, double p,
                          float keep) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool k = kept(base, static_cast<uint64_t>(i), p);
    if constexpr (Add) {
      if (k) y[i] += x[i] * keep;
    } else {
      y[i] = k ? x[i] * keep : 0.0f;
    }
  }
}

__global__ void from_bf16_k(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

__global__ void to_bf16_k(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    y[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

unsigned grid(int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

}  // namespace

void rope_table(int64_t max_pos, int64_t d, double theta, float* cos_sin) {
  if (max_pos * d <= 0) return;
  std::vector<float> table(static_cast<size_t>(max_pos * d));
  rope_table_host(max_pos, d, theta, table.data());
  copy(cos_sin, table.data(), table.size() * sizeof(float));
}

int64_t first_outside(const int32_t* v, int64_t n, int64_t lo, int64_t hi, int64_t allowed,
                      int32_t* value) {
  if (n <= 0) return -1;
  Temp<unsigned long long> first(1);
  const unsigned long long none = ~0ull;
  TITAN_CUDA_CHECK(
      cudaMemcpyAsync(first.get(), &none, sizeof none, cudaMemcpyHostToDevice, stream()));
  first_outside_k<<<grid(n), kThreads, 0, stream()>>>(v, n, lo, hi, allowed, first.get());
  TITAN_CUDA_LAUNCHED("first_outside");
  unsigned long long bad = none;
  TITAN_CUDA_CHECK(
      cudaMemcpyAsync(&bad, first.get(), sizeof bad, cudaMemcpyDeviceToHost, stream()));
  TITAN_CUDA_CHECK(cudaStreamSynchronize(stream()));
  if (bad == none) return -1;
  if (value) TITAN_CUDA_CHECK(cudaMemcpy(value, v + bad, sizeof *value, cudaMemcpyDeviceToHost));
  return static_cast<int64_t>(bad);
}

int64_t first_bad_position(const int32_t* pos, int64_t n, int64_t limit) {
  return first_outside(pos, n, 0, limit, kNoException, nullptr);
}

void embedding_fwd(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t D,
                   float* out) {
  embedding_fwd_range(ids, T, table, V, 0, V, D, out);
}

void embedding_fwd_range(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t v0,
                         int64_t vl, int64_t D, float* out) {
  if (T <= 0) return;
  int32_t id = 0;
  const int64_t bad = first_outside(ids, T, 0, V, kNoException, &id);
  if (bad >= 0)
    throw Error("token id " + std::to_string(id) + " at position " + std::to_string(bad) +
                " is outside the vocabulary [0, " + std::to_string(V) +
                "); check the tokenizer and model.vocab_size");
  gather_rows<<<grid(T * D), kThreads, 0, stream()>>>(ids, T, table, v0, vl, D, out);
  TITAN_CUDA_LAUNCHED("embedding_fwd");
}

void embedding_bwd(const int32_t* ids, int64_t T, const float* dout, int64_t D, float* dtable) {
  embedding_bwd_range(ids, T, dout, 0, (int64_t{1} << 31) - 1, D, dtable);
}

void embedding_bwd_range(const int32_t* ids, int64_t T, const float* dout, int64_t v0, int64_t vl,
                         int64_t D, float* dtable) {
  if (T <= 0) return;
  check(T < (int64_t{1} << 31), "embedding_bwd: more than 2^31 tokens");
  const int n = static_cast<int>(T);
  Temp<int32_t> keys(T), order(T), sorted_ids(T), sorted_tokens(T);
  range_keys<<<grid(T), kThreads, 0, stream()>>>(ids, T, v0, vl, keys.get());
  iota_k<<<grid(T), kThreads, 0, stream()>>>(order.get(), T);
  TITAN_CUDA_LAUNCHED("embedding_bwd (keys, token order)");
  size_t temp_bytes = 0;
  TITAN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys.get(),
                                                   sorted_ids.get(), order.get(),
                                                   sorted_tokens.get(), n, 0, 32, stream()));
  Temp<unsigned char> temp(static_cast<int64_t>(temp_bytes));
  TITAN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys.get(),
                                                   sorted_ids.get(), order.get(),
                                                   sorted_tokens.get(), n, 0, 32, stream()));
  const unsigned blocks = static_cast<unsigned>(T < 65535 ? T : 65535);
  scatter_runs<<<blocks, 128, 0, stream()>>>(sorted_ids.get(), sorted_tokens.get(), T, vl, dout, D,
                                             dtable);
  TITAN_CUDA_LAUNCHED("embedding_bwd");
}

void rmsnorm_fwd(const NormRows& s, const float* x, const float* w, float eps, float* y,
                 float* rstd) {
  const int64_t rows = s.T * s.H;
  if (rows <= 0) return;
  rmsnorm_fwd_rows<<<static_cast<unsigned>(rows), 128, 0, stream()>>>(s, x, w, eps, y, rstd);
  TITAN_CUDA_LAUNCHED("rmsnorm_fwd");
}

void rmsnorm_bwd(const NormRows& s, const float* dy, const float* x, const float* w,
                 const float* rstd, float* dx, float* dw, float* scratch) {
  const int64_t rows = s.T * s.H;
  if (rows <= 0) return;
  rmsnorm_bwd_rows<<<static_cast<unsigned>(rows), 128, 0, stream()>>>(s, dy, x, w, rstd, dx);
  TITAN_CUDA_LAUNCHED("rmsnorm_bwd");
  if (!dw) return;
  const int64_t nb = rows < 32 ? rows : 32;  // ops::rmsnorm_bwd's fixed row blocks
  rmsnorm_dw_blocks<<<dim3(blocks_for(s.N, kThreads), static_cast<unsigned>(nb)), kThreads, 0,
                      stream()>>>(s, dy, x, rstd, nb, scratch);
  TITAN_CUDA_LAUNCHED("rmsnorm_bwd (weight blocks)");
  add_blocks<<<blocks_for(s.N, kThreads), kThreads, 0, stream()>>>(dw, scratch, nb, s.N);
  TITAN_CUDA_LAUNCHED("rmsnorm_bwd (weight sum)");
}

void rope_fwd(float* x, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin) {
  if (T * H * d <= 0) return;
  rope_rows<<<grid(T * H * d / 2), kThreads, 0, stream()>>>(x, T, H, d, ldx, positions, cos_sin,
                                                            1.0f);
  TITAN_CUDA_LAUNCHED("rope_fwd");
}

void rope_bwd(float* dx, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin) {
  if (T * H * d <= 0) return;
  rope_rows<<<grid(T * H * d / 2), kThreads, 0, stream()>>>(dx, T, H, d, ldx, positions, cos_sin,
                                                            -1.0f);
  TITAN_CUDA_LAUNCHED("rope_bwd");
}

RopeOp cos_sin_rope_op() {
  RopeOp op;
  op.name = "cos_sin_rope";
  op.device = "cuda";
  op.forward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                  const int32_t* pos, const float* cs) { rope_fwd(x, B * S, H, d, ldx, pos, cs); };
  op.backward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                   const int32_t* pos, const float* cs) { rope_bwd(x, B * S, H, d, ldx, pos, cs); };
  return op;
}

void swiglu_fwd(const float* ab, float* g, int64_t T, int64_t F) {
  if (T * F <= 0) return;
  swiglu_fwd_k<<<grid(T * F), kThreads, 0, stream()>>>(ab, g, T, F);
  TITAN_CUDA_LAUNCHED("swiglu_fwd");
}

void swiglu_bwd(const float* dg, const float* ab, float* dab, int64_t T, int64_t F) {
  if (T * F <= 0) return;
  swiglu_bwd_k<<<grid(T * F), kThreads, 0, stream()>>>(dg, ab, dab, T, F);
  TITAN_CUDA_LAUNCHED("swiglu_bwd");
}

void add(const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return;
  add_k<<<grid(n), kThreads, 0, stream()>>>(a, b, out, n);
  TITAN_CUDA_LAUNCHED("add");
}

void add_inplace(float* y, const float* x, int64_t n) { add(y, x, y, n); }

void scale_inplace(float* x, int64_t n, float s) {
  if (n <= 0) return;
  scale_k<<<grid(n), kThreads, 0, stream()>>>(x, n, s);
  TITAN_CUDA_LAUNCHED("scale_inplace");
}

namespace {
__global__ void copy_rows_k(const float* src, int64_t src_stride, const int32_t* src_row,
                            float* dst, int64_t dst_stride, const int32_t* dst_row, int64_t n,
                            int64_t width) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * width;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / width, c = e % width;
    dst[(dst_row ? dst_row[i] : i) * dst_stride + c] =
        src[(src_row ? src_row[i] : i) * src_stride + c];
  }
}

__global__ void sum_rows_k(const float* src, int64_t src_stride, const int32_t* index, int64_t k,
                           float* dst, int64_t n, int64_t width) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * width;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, c = e % width;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += src[index[t * k + j] * src_stride + c];
    dst[e] = acc;
  }
}
}  // namespace

void copy_rows(const float* src, int64_t src_stride, const int32_t* src_row, float* dst,
               int64_t dst_stride, const int32_t* dst_row, int64_t n, int64_t width) {
  if (n * width <= 0) return;
  copy_rows_k<<<grid(n * width), kThreads, 0, stream()>>>(src, src_stride, src_row, dst, dst_stride,
                                                          dst_row, n, width);
  TITAN_CUDA_LAUNCHED("copy_rows");
}

void sum_rows(const float* src, int64_t src_stride, const int32_t* index, int64_t k, float* dst,
              int64_t n, int64_t width) {
  if (n * width <= 0) return;
  sum_rows_k<<<grid(n * width), kThreads, 0, stream()>>>(src, src_stride, index, k, dst, n, width);
  TITAN_CUDA_LAUNCHED("sum_rows");
}

namespace {
template <bool Add>
void run_dropout(const float* x, float* y, int64_t n, uint64_t seed, uint64_t s, double p) {
  if (n <= 0) return;
  // random_u64(seed, s, k) = splitmix64(base + k): the per-stream part once, on the host
  const uint64_t base = splitmix64(seed ^ splitmix64(s + 0x632BE59BD9B4E019ull));
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  dropout_k<Add><<<grid(n), kThreads, 0, stream()>>>(x, y, n, base, p, keep);
  TITAN_CUDA_LAUNCHED(Add ? "dropout_add" : "dropout");
}
}  // namespace

void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p) {
  run_dropout<false>(x, y, n, seed, stream, p);
}

void dropout_add(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p) {
  run_dropout<true>(x, y, n, seed, stream, p);
}

void to_bf16(const float* x, int64_t n, uint16_t* y) {
  if (n <= 0) return;
  to_bf16_k<<<grid(n), kThreads, 0, stream()>>>(x, n, y);
  TITAN_CUDA_LAUNCHED("to_bf16");
}

void from_bf16(const uint16_t* x, int64_t n, float* y) {
  if (n <= 0) return;
  from_bf16_k<<<grid(n), kThreads, 0, stream()>>>(x, n, y);
  TITAN_CUDA_LAUNCHED("from_bf16");
}

}  // namespace titan::ops::cuda
