// The bf16 attention on tensor cores (ops/cuda/attention_tc.h): attention_fwd_bf16 and
// attention_bwd_bf16's contract (attention.h; the bf16 rounding of ops/cuda/attention.cu) for
// head_dim 64 and 128, which attention.cu dispatches here.
//   forward   o[T, Hq·d] = softmax(q·kᵀ·scale + mask)·v, lse[B, Hq, S]
//   backward  (differentiates the forward) dq, dk, dv from dout, o's delta and lse
// q, k, v, dout, the probabilities P and dS are rounded to bf16 (round to nearest even) before
// each product; the products run as WMMA 16×16×16 bf16 tiles with fp32 accumulation; softmax,
// lse, the row sums and delta stay fp32. FlashAttention-2's schedule: a block of 4 warps takes
// 64 queries (forward, dq) or 64 keys (dk, dv) of one head, each warp 16 of them, and walks the
// other side's tiles of 64 through shared memory (bf16 tiles, rows padded by 8 against bank
// conflicts). The forward keeps each warp's output rows in fp32 shared memory, rescaled by the
// online softmax after each key tile; dq, dk and dv accumulate in WMMA fragments; dk/dv blocks
// sum their kv head's query heads in order: no atomics, deterministic. The visible keys of query
// i are [seg_start[i], i]; key tiles before the tile's first visible key and after its last query
// are skipped.
#include <cuda_bf16.h>
#include <mma.h>

#include <climits>

#include "titan/ops/cuda/attention_tc.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kRows = 64;  // queries (or keys) per block and per tile of the other side
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLds = kRows + 4;  // fp32 score rows (floats; a multiple of 4 for WMMA)
constexpr int kLdp = kRows + 8;  // bf16 probability rows (a multiple of 8)

template <int D>
struct Ld {
  static constexpr int h = D + 8;  // bf16 tile rows [64][D + 8]
  static constexpr int o = D + 4;  // fp32 output rows [16][D + 4] per warp
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [r0, r0 + 64) of one head (columns [col, col + D) of the [T, ld] matrix of a batch row
// starting at token row0) into dst[64][D + 8] as bf16, zeros past S.
template <int D>
__device__ void load_rows(bf16* dst, const float* src, int64_t row0, int64_t r0, int64_t S,
                          int64_t ld, int64_t col) {
  for (int e = threadIdx.x; e < kRows * D; e += blockDim.x) {
    const int i = e / D, c = e % D;
    const float x = r0 + i < S ? src[(row0 + r0 + i) * ld + col + c] : 0.0f;
    dst[i * Ld<D>::h + c] = __float2bfloat16_rn(x);
  }
}

// out[16][64] (fp32, ld kLds) = A[16 rows][D] · Bᵀ where B is [64 rows][D]: both bf16 tiles of
// ld Ld<D>::h (Bᵀ read column-major from B's rows).
template <int D>
__device__ void rows_times_rows_t(const bf16* A, const bf16* B, float* out) {
#pragma unroll
  for (int n = 0; n < kRows / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      FragA a;
      FragBT b;
      wmma::load_matrix_sync(a, A + 16 * c, Ld<D>::h);
      wmma::load_matrix_sync(b, B + 16 * n * Ld<D>::h + 16 * c, Ld<D>::h);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, kLds, wmma::mem_row_major);
  }
}

// acc[n] += P[16][64] · B[64][D]: P bf16 rows of ld kLdp, B bf16 rows of ld Ld<D>::h.
template <int D>
__device__ void p_times_rows(const bf16* P, const bf16* B, FragC* acc) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
#pragma unroll
    for (int c = 0; c < kRows / 16; ++c) {
      FragA a;
      FragB b;
      wmma::load_matrix_sync(a, P + 16 * c, kLdp);
      wmma::load_matrix_sync(b, B + 16 * c * Ld<D>::h + 16 * n, Ld<D>::h);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
}

// The first key any of the queries [q0, q0 + rows) sees: their smallest seg_start.
__device__ int32_t first_visible(const int32_t* seg, int64_t q0, int64_t rows) {
  int32_t lo = static_cast<int32_t>(q0);
  for (int64_t i = 0; i < rows; ++i) lo = min(lo, seg[q0 + i]);
  return lo;
}

// The query side of the backward for queries [q0, q0 + rows) of head h in batch row b: q and
// dout as bf16 tiles, their lse and delta, their segment starts (INT_MAX past S).
template <int D>
__device__ void load_query_side(const AttnShape& s, const float* q, const float* dout,
                                const float* lse, const float* delta, const int32_t* seg, int64_t b,
                                int64_t h, int64_t q0, int64_t rows, bf16* Qs, bf16* dOs, float* L,
                                float* Dl, int32_t* seg_q) {
  const int64_t row0 = b * s.S;
  load_rows<D>(Qs, q, row0, q0, s.S, s.ldq, h * D);
  load_rows<D>(dOs, dout, row0, q0, s.S, s.Hq * D, h * D);
  if (threadIdx.x < kRows) {
    const bool in = threadIdx.x < rows;
    L[threadIdx.x] = in ? lse[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
    Dl[threadIdx.x] = in ? delta[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
    seg_q[threadIdx.x] = in ? seg[row0 + q0 + threadIdx.x] : INT_MAX;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    fwd_tc_k(AttnShape s, const float* q, const float* k, const float* v, const int32_t* seg,
             float* o, float* lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kRows * Ld<D>::h;
  bf16* Vs = Ks + kRows * Ld<D>::h;
  float* Ss = reinterpret_cast<float*>(Vs + kRows * Ld<D>::h);    // [warp][16][kLds]
  bf16* Ps = reinterpret_cast<bf16*>(Ss + kWarps * 16 * kLds);    // [warp][16][kLdp]
  float* Os = reinterpret_cast<float*>(Ps + kWarps * 16 * kLdp);  // [warp][16][Ld::o]
  float* Ts = Os + kWarps * 16 * Ld<D>::o;                        // P·V of one key tile
  __shared__ float m[kRows], l[kRows], alpha[kRows];
  __shared__ int32_t seg_q[kRows];
  __shared__ int32_t kmin;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t g = h / (s.Hq / s.Hkv), row0 = b * s.S;
  const int64_t rows = s.S - q0 < kRows ? s.S - q0 : kRows;
  float* Sw = Ss + warp * 16 * kLds;
  bf16* Pw = Ps + warp * 16 * kLdp;
  float* Ow = Os + warp * 16 * Ld<D>::o;
  float* Tw = Ts + warp * 16 * Ld<D>::o;
  load_rows<D>(Qs, q, row0, q0, s.S, s.ldq, h * D);
  for (int e = threadIdx.x; e < kWarps * 16 * Ld<D>::o; e += blockDim.x) Os[e] = 0.0f;
  if (threadIdx.x < kRows) {
    m[threadIdx.x] = -INFINITY;
    l[threadIdx.x] = 0.0f;
    seg_q[threadIdx.x] = threadIdx.x < rows ? seg[row0 + q0 + threadIdx.x] : INT_MAX;
  }
  if (threadIdx.x == 0) kmin = first_visible(seg + row0, q0, rows);
  __syncthreads();
  for (int64_t k0 = kmin / kRows * kRows; k0 < q0 + rows; k0 += kRows) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_rows<D>(Ks, k, row0, k0, s.S, s.ldk, g * D);
    load_rows<D>(Vs, v, row0, k0, s.S, s.ldv, g * D);
    __syncthreads();
    rows_times_rows_t<D>(Qs + warp * 16 * Ld<D>::h, Ks, Sw);
    __syncwarp();
    {  // online softmax of the warp's 16 rows: two lanes per row, 32 keys each
      const int r = lane >> 1, half = lane & 1, i = 16 * warp + r;
      const int64_t qi = q0 + i;
      float mx = -INFINITY;
      for (int j = 32 * half; j < 32 * half + 32; ++j) {
        const int64_t kj = k0 + j;
        const bool visible = i < rows && kj <= qi && kj >= seg_q[i];
        const float x = visible ? Sw[r * kLds + j] * s.scale : -INFINITY;
        Sw[r * kLds + j] = x;
        mx = fmaxf(mx, x);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float mnew = fmaxf(m[i], mx);
      const float a = mnew == -INFINITY ? 1.0f : expf(m[i] - mnew);
      float sum = 0.0f;
      for (int j = 32 * half; j < 32 * half + 32; ++j) {
        const float p = mnew == -INFINITY ? 0.0f : expf(Sw[r * kLds + j] - mnew);
        sum += p;
        Pw[r * kLdp + j] = __float2bfloat16_rn(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      __syncwarp();
      if (half == 0) {
        l[i] = l[i] * a + sum;
        m[i] = mnew;
        alpha[i] = a;
      }
    }
    __syncwarp();
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
    p_times_rows<D>(Pw, Vs, acc);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(Tw + 16 * n, acc[n], Ld<D>::o, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) {
      const int r = e / D, c = e % D;
      Ow[r * Ld<D>::o + c] = Ow[r * Ld<D>::o + c] * alpha[16 * warp + r] + Tw[r * Ld<D>::o + c];
    }
    __syncwarp();
  }
  for (int e = lane; e < 16 * D; e += 32) {
    const int r = e / D, c = e % D, i = 16 * warp + r;
    if (i < rows) o[(row0 + q0 + i) * s.Hq * D + h * D + c] = Ow[r * Ld<D>::o + c] / l[i];
  }
  if (lane < 16 && 16 * warp + lane < rows) {
    const int i = 16 * warp + lane;
    lse[(b * s.Hq + h) * s.S + q0 + i] = m[i] + logf(l[i]);
  }
}

// dq over query tiles: one block takes 64 queries of head h; per key tile S = q·kᵀ, P from lse,
// dP = dout·vᵀ, dS = P ⊙ (dP − delta) (bf16), dq += dS·k; dq·scale at the end.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_tc_k(AttnShape s, const float* q, const float* k, const float* v, const float* lse,
            const float* dout, const int32_t* seg, const float* delta, float* dq) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kRows * Ld<D>::h;
  bf16* Ks = dOs + kRows * Ld<D>::h;
  bf16* Vs = Ks + kRows * Ld<D>::h;
  float* Ss = reinterpret_cast<float*>(Vs + kRows * Ld<D>::h);  // [warp][16][kLds]
  float* dPs = Ss + kWarps * 16 * kLds;
  bf16* dSs = reinterpret_cast<bf16*>(dPs + kWarps * 16 * kLds);   // [warp][16][kLdp]
  float* Ts = reinterpret_cast<float*>(dSs + kWarps * 16 * kLdp);  // [warp][16][Ld::o]
  __shared__ float L[kRows], Dl[kRows];
  __shared__ int32_t seg_q[kRows];
  __shared__ int32_t kmin;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t g = h / (s.Hq / s.Hkv), row0 = b * s.S;
  const int64_t rows = s.S - q0 < kRows ? s.S - q0 : kRows;
  float* Sw = Ss + warp * 16 * kLds;
  float* dPw = dPs + warp * 16 * kLds;
  bf16* dSw = dSs + warp * 16 * kLdp;
  load_query_side<D>(s, q, dout, lse, delta, seg, b, h, q0, rows, Qs, dOs, L, Dl, seg_q);
  if (threadIdx.x == 0) kmin = first_visible(seg + row0, q0, rows);
  FragC acc[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  __syncthreads();
  for (int64_t k0 = kmin / kRows * kRows; k0 < q0 + rows; k0 += kRows) {
    __syncthreads();
    load_rows<D>(Ks, k, row0, k0, s.S, s.ldk, g * D);
    load_rows<D>(Vs, v, row0, k0, s.S, s.ldv, g * D);
    __syncthreads();
    rows_times_rows_t<D>(Qs + warp * 16 * Ld<D>::h, Ks, Sw);
    rows_times_rows_t<D>(dOs + warp * 16 * Ld<D>::h, Vs, dPw);
    __syncwarp();
    for (int e = lane; e < 16 * kRows; e += 32) {
      const int r = e / kRows, j = e % kRows, i = 16 * warp + r;
      const int64_t qi = q0 + i, kj = k0 + j;
      const bool visible = i < rows && kj <= qi && kj >= seg_q[i];
      float ds = 0.0f;
      if (visible) {
        const float p = expf(Sw[r * kLds + j] * s.scale - L[i]);
        ds = p * (dPw[r * kLds + j] - Dl[i]);
      }
      dSw[r * kLdp + j] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    p_times_rows<D>(dSw, Ks, acc);
  }
  float* Tw = Ts + warp * 16 * Ld<D>::o;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(Tw + 16 * n, acc[n], Ld<D>::o, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {
    const int r = e / D, c = e % D, i = 16 * warp + r;
    if (i < rows) dq[(row0 + q0 + i) * s.Hq * D + h * D + c] = Tw[r * Ld<D>::o + c] * s.scale;
  }
}

// dk, dv over key tiles: one block takes 64 keys of kv head g and sums its query heads in order;
// each warp holds 16 keys: Sᵀ = k·qᵀ, dPᵀ = v·doutᵀ, then dv += Pᵀ·dout and dk += dSᵀ·q.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dkv_tc_k(AttnShape s, const float* q, const float* k, const float* v, const float* lse,
             const float* dout, const int32_t* seg, const float* delta, float* dk, float* dv) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kRows * Ld<D>::h;
  bf16* Qs = Vs + kRows * Ld<D>::h;
  bf16* dOs = Qs + kRows * Ld<D>::h;
  float* Ss = reinterpret_cast<float*>(dOs + kRows * Ld<D>::h);  // [warp][16 keys][kLds]
  float* dPs = Ss + kWarps * 16 * kLds;
  bf16* Ps = reinterpret_cast<bf16*>(dPs + kWarps * 16 * kLds);  // [warp][16 keys][kLdp]
  bf16* dSs = Ps + kWarps * 16 * kLdp;
  float* Ts = reinterpret_cast<float*>(dSs + kWarps * 16 * kLdp);  // [warp][16][Ld::o]
  __shared__ float L[kRows], Dl[kRows];
  __shared__ int32_t seg_q[kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, g = blockIdx.y, k0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int64_t rep = s.Hq / s.Hkv, row0 = b * s.S;
  const int64_t keys = s.S - k0 < kRows ? s.S - k0 : kRows;
  float* Sw = Ss + warp * 16 * kLds;
  float* dPw = dPs + warp * 16 * kLds;
  bf16* Pw = Ps + warp * 16 * kLdp;
  bf16* dSw = dSs + warp * 16 * kLdp;
  load_rows<D>(Ks, k, row0, k0, s.S, s.ldk, g * D);
  load_rows<D>(Vs, v, row0, k0, s.S, s.ldv, g * D);
  FragC acc_v[D / 16], acc_k[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(acc_v[n], 0.0f);
    wmma::fill_fragment(acc_k[n], 0.0f);
  }
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
    for (int64_t q0 = k0; q0 < s.S; q0 += kRows) {
      if (seg[row0 + q0] > k0 + keys - 1) break;  // no later query sees these keys (attention.cu)
      const int64_t rows = s.S - q0 < kRows ? s.S - q0 : kRows;
      __syncthreads();  // every warp is done with the previous query tile
      load_query_side<D>(s, q, dout, lse, delta, seg, b, h, q0, rows, Qs, dOs, L, Dl, seg_q);
      __syncthreads();
      rows_times_rows_t<D>(Ks + warp * 16 * Ld<D>::h, Qs, Sw);
      rows_times_rows_t<D>(Vs + warp * 16 * Ld<D>::h, dOs, dPw);
      __syncwarp();
      for (int e = lane; e < 16 * kRows; e += 32) {
        const int r = e / kRows, i = e % kRows, j = 16 * warp + r;  // key j, query i
        const int64_t qi = q0 + i, kj = k0 + j;
        const bool visible = i < rows && j < keys && kj <= qi && kj >= seg_q[i];
        float p = 0.0f, ds = 0.0f;
        if (visible) {
          p = expf(Sw[r * kLds + i] * s.scale - L[i]);
          ds = p * (dPw[r * kLds + i] - Dl[i]);
        }
        Pw[r * kLdp + i] = __float2bfloat16_rn(p);
        dSw[r * kLdp + i] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      p_times_rows<D>(Pw, dOs, acc_v);
      p_times_rows<D>(dSw, Qs, acc_k);
    }
  float* Tw = Ts + warp * 16 * Ld<D>::o;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(Tw + 16 * n, pass == 0 ? acc_k[n] : acc_v[n], Ld<D>::o,
                              wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) {
      const int r = e / D, c = e % D, j = 16 * warp + r;
      if (j >= keys) continue;
      const float x = Tw[r * Ld<D>::o + c];
      if (pass == 0)
        dk[(row0 + k0 + j) * s.ldk + g * D + c] = x * s.scale;
      else
        dv[(row0 + k0 + j) * s.ldv + g * D + c] = x;
    }
    __syncwarp();
  }
}

template <typename K>
void allow_shared(K kernel, size_t bytes) {
  TITAN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

// Shared memory of the kernels: bf16 tiles, fp32 score tiles, bf16 P/dS tiles, fp32 output rows.
template <int D>
constexpr size_t shared_bytes(int bf16_tiles, int score_tiles, int p_tiles) {
  return sizeof(bf16) * bf16_tiles * kRows * Ld<D>::h +
         sizeof(float) * score_tiles * kWarps * 16 * kLds +
         sizeof(bf16) * p_tiles * kWarps * 16 * kLdp + sizeof(float) * kWarps * 16 * Ld<D>::o;
}

template <int D>
void fwd_tc(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
            float* o, float* lse) {
  // Q, K, V; scores; P; output rows and the tile's P·V
  const size_t shared = shared_bytes<D>(3, 1, 1) + sizeof(float) * kWarps * 16 * Ld<D>::o;
  allow_shared(fwd_tc_k<D>, shared);
  const dim3 grid(static_cast<unsigned>((s.S + kRows - 1) / kRows), static_cast<unsigned>(s.Hq),
                  static_cast<unsigned>(s.B));
  fwd_tc_k<D><<<grid, kThreads, shared, stream()>>>(s, q, k, v, seg, o, lse);
  TITAN_CUDA_LAUNCHED("attention_fwd_bf16 (tensor cores)");
}

template <int D>
void bwd_tc(const AttnShape& s, const float* q, const float* k, const float* v, const float* lse,
            const float* dout, const int32_t* seg, const float* delta, float* dq, float* dk,
            float* dv) {
  const unsigned tiles = static_cast<unsigned>((s.S + kRows - 1) / kRows);
  const size_t dq_shared = shared_bytes<D>(4, 2, 1);  // Q, dO, K, V; S, dP; dS; dq rows
  allow_shared(dq_tc_k<D>, dq_shared);
  dq_tc_k<D><<<dim3(tiles, static_cast<unsigned>(s.Hq), static_cast<unsigned>(s.B)), kThreads,
               dq_shared, stream()>>>(s, q, k, v, lse, dout, seg, delta, dq);
  TITAN_CUDA_LAUNCHED("attention_bwd_bf16 (tensor cores, dq)");
  const size_t kv_shared = shared_bytes<D>(4, 2, 2);  // K, V, Q, dO; Sᵀ, dPᵀ; P, dS; rows
  allow_shared(dkv_tc_k<D>, kv_shared);
  dkv_tc_k<D><<<dim3(tiles, static_cast<unsigned>(s.Hkv), static_cast<unsigned>(s.B)), kThreads,
                kv_shared, stream()>>>(s, q, k, v, lse, dout, seg, delta, dk, dv);
  TITAN_CUDA_LAUNCHED("attention_bwd_bf16 (tensor cores, dk, dv)");
}

}  // namespace

bool attention_tc_supports(const AttnShape& s) { return s.d == 64 || s.d == 128; }

void attention_fwd_tc(const AttnShape& s, const float* q, const float* k, const float* v,
                      const int32_t* seg_start, float* o, float* lse) {
  if (s.d == 64)
    fwd_tc<64>(s, q, k, v, seg_start, o, lse);
  else
    fwd_tc<128>(s, q, k, v, seg_start, o, lse);
}

void attention_bwd_tc(const AttnShape& s, const float* q, const float* k, const float* v,
                      const float* lse, const float* dout, const int32_t* seg_start,
                      const float* delta, float* dq, float* dk, float* dv) {
  if (s.d == 64)
    bwd_tc<64>(s, q, k, v, lse, dout, seg_start, delta, dq, dk, dv);
  else
    bwd_tc<128>(s, q, k, v, lse, dout, seg_start, delta, dq, dk, dv);
}

}  // namespace titan::ops::cuda
