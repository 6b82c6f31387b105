// Attention on the GPU (ops/cuda/cuda_ops.h), attention.h's contract:
//   o = softmax(q·kᵀ·scale + mask)·v per (row b, query head h), kv head h / (Hq/Hkv); key j is
//   visible to query i iff seg_start[i] <= j <= i; lse = log Σ exp(scores) saved per query.
//   q[T, Hq, d] (token stride ldq), k, v [T, Hkv, d] (ldk, ldv); o[T, Hq·d]; lse[B, Hq, S].
// The bf16 variants at head_dim 64 and 128 run on tensor cores (ops/cuda/attention_tc.cu); the
// rest: FlashAttention-2's schedule on CUDA cores, fp32: a block takes 32 queries (forward, dq) or
// 32 keys (dk, dv) of one head and walks the other side's tiles of 32 through shared memory with an
// online softmax; the backward recomputes the probabilities from lse (attention_bwd: delta =
// rowsum(dout ⊙ o), then dq over query tiles, then dk/dv over key tiles, each kv head's block
// summing its query heads: no atomics, deterministic). The bf16 variants round q, k, v, dout, the
// probabilities and dS to bf16 before each product (sums, softmax and lse in fp32), as the CPU's
// attention_*_bf16 do, but at other points: the CPU rounds the normalised probabilities and
// dS·scale, these the tile's exp(s − running max) (normalised after the product) and dS before
// the scale, so the two differ within a bf16 ulp of those products' inputs.
// attention_cached (generation): one block per (token, head) over that token's cached keys
// (online softmax); k and v are device arrays of device pointers, n_keys a device array.
// d <= 256 (shared memory: up to 6·32·(d + 1) floats, 201 KiB at d 256).
#include <cmath>

#include "titan/ops/cuda/attention_tc.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

constexpr int kTile = 32;  // queries and keys per tile
constexpr int kThreads = 256;
constexpr int kLd = kTile + 1;  // score tiles padded against bank conflicts

template <bool BF16>
__device__ __forceinline__ float rnd(float x) {
  if constexpr (BF16) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
    return __uint_as_float(((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16);
  } else {
    return x;
  }
}

// rows [r0, r0 + 32) of one head (columns [col, col + d) of a [T, ld] matrix of row b) into
// dst[32][d + 1] (rows padded by one float against shared-memory bank conflicts), zeros past S,
// rounded when BF16.
template <bool BF16>
__device__ void load_tile(float* dst, const float* src, int64_t row0, int64_t r0, int64_t S,
                          int64_t ld, int64_t col, int64_t d) {
  for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int64_t i = e / d, c = e % d;
    dst[i * (d + 1) + c] = r0 + i < S ? rnd<BF16>(src[(row0 + r0 + i) * ld + col + c]) : 0.0f;
  }
}

// The first key any of the queries [q0, q0 + rows) of a row sees: their smallest seg_start.
__device__ int32_t first_key(const int32_t* seg, int64_t q0, int64_t rows) {
  int32_t lo = static_cast<int32_t>(q0);
  for (int64_t i = 0; i < rows; ++i) lo = min(lo, seg[q0 + i]);
  return lo;
}

__device__ float dot(const float* a, const float* b, int64_t d) {
  float s = 0.0f;
  for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

template <bool BF16>
__global__ void fwd_k(AttnShape s, const float* q, const float* k, const float* v,
                      const int32_t* seg, float* o, float* lse) {
  extern __shared__ float sm[];
  const int64_t d = s.d, ld = d + 1, b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile;
  const int64_t g = h / (s.Hq / s.Hkv), row0 = b * s.S;
  float* Qs = sm;
  float* Ks = Qs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  float* Os = Vs + kTile * ld;
  float* Ps = Os + kTile * ld;  // [32][kLd]
  __shared__ float m[kTile], l[kTile], alpha[kTile];
  __shared__ int32_t kmin;
  const int64_t rows = s.S - q0 < kTile ? s.S - q0 : kTile;
  load_tile<BF16>(Qs, q, row0, q0, s.S, s.ldq, h * d, d);
  for (int64_t e = threadIdx.x; e < kTile * ld; e += blockDim.x) Os[e] = 0.0f;
  if (threadIdx.x < kTile) {
    m[threadIdx.x] = -INFINITY;
    l[threadIdx.x] = 0.0f;
  }
  if (threadIdx.x == 0) kmin = first_key(seg + row0, q0, rows);
  __syncthreads();
  for (int64_t k0 = kmin / kTile * kTile; k0 < q0 + rows; k0 += kTile) {
    load_tile<BF16>(Ks, k, row0, k0, s.S, s.ldk, g * d, d);
    load_tile<BF16>(Vs, v, row0, k0, s.S, s.ldv, g * d, d);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
      const int i = e / kTile, j = e % kTile;
      const int64_t qi = q0 + i, kj = k0 + j;
      const bool visible = i < rows && kj <= qi && kj >= seg[row0 + qi];
      Ps[i * kLd + j] = visible ? dot(Qs + i * ld, Ks + j * ld, d) * s.scale : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < kTile) {
      const int i = threadIdx.x;
      float mx = m[i];
      for (int j = 0; j < kTile; ++j) mx = fmaxf(mx, Ps[i * kLd + j]);
      const float a = mx == -INFINITY ? 1.0f : expf(m[i] - mx);
      float sum = 0.0f;
      for (int j = 0; j < kTile; ++j) {
        const float p = mx == -INFINITY ? 0.0f : expf(Ps[i * kLd + j] - mx);
        sum += p;
        Ps[i * kLd + j] = rnd<BF16>(p);
      }
      l[i] = l[i] * a + sum;
      m[i] = mx;
      alpha[i] = a;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
      const int64_t i = e / d, c = e % d;
      float acc = 0.0f;
      for (int j = 0; j < kTile; ++j) acc += Ps[i * kLd + j] * Vs[j * ld + c];
      Os[i * ld + c] = Os[i * ld + c] * alpha[i] + acc;
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int64_t i = e / d, c = e % d;
    o[(row0 + q0 + i) * s.Hq * d + h * d + c] = Os[i * ld + c] / l[i];
  }
  if (threadIdx.x < rows)
    lse[(b * s.Hq + h) * s.S + q0 + threadIdx.x] = m[threadIdx.x] + logf(l[threadIdx.x]);
}

// delta[b, h, i] = Σ_c dout[i, h, c] · o[i, h, c] (one warp per query).
__global__ void delta_k(AttnShape s, const float* o, const float* dout, float* delta) {
  const int64_t n = s.B * s.Hq * s.S;
  const int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= n) return;
  const int64_t i = w % s.S, h = (w / s.S) % s.Hq, b = w / (s.S * s.Hq);
  const int64_t at = (b * s.S + i) * s.Hq * s.d + h * s.d;
  float acc = 0.0f;
  for (int64_t c = lane; c < s.d; c += 32) acc += dout[at + c] * o[at + c];
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[w] = acc;
}

// dq over query tiles (one block: 32 queries of head h).
template <bool BF16>
__global__ void dq_k(AttnShape s, const float* q, const float* k, const float* v, const float* lse,
                     const float* dout, const int32_t* seg, const float* delta, float* dq) {
  extern __shared__ float sm[];
  const int64_t d = s.d, ld = d + 1, b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile;
  const int64_t g = h / (s.Hq / s.Hkv), row0 = b * s.S, ld_o = s.Hq * d;
  float* Qs = sm;
  float* dOs = Qs + kTile * ld;
  float* Ks = dOs + kTile * ld;
  float* Vs = Ks + kTile * ld;
  float* dQs = Vs + kTile * ld;
  float* Ps = dQs + kTile * ld;  // P, then dS
  __shared__ float L[kTile], D[kTile];
  __shared__ int32_t kmin;
  const int64_t rows = s.S - q0 < kTile ? s.S - q0 : kTile;
  load_tile<BF16>(Qs, q, row0, q0, s.S, s.ldq, h * d, d);
  load_tile<BF16>(dOs, dout, row0, q0, s.S, ld_o, h * d, d);
  for (int64_t e = threadIdx.x; e < kTile * ld; e += blockDim.x) dQs[e] = 0.0f;
  if (threadIdx.x < kTile) {
    const bool in = threadIdx.x < rows;
    L[threadIdx.x] = in ? lse[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
    D[threadIdx.x] = in ? delta[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
  }
  if (threadIdx.x == 0) kmin = first_key(seg + row0, q0, rows);
  __syncthreads();
  for (int64_t k0 = kmin / kTile * kTile; k0 < q0 + rows; k0 += kTile) {
    load_tile<BF16>(Ks, k, row0, k0, s.S, s.ldk, g * d, d);
    load_tile<BF16>(Vs, v, row0, k0, s.S, s.ldv, g * d, d);
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
      const int i = e / kTile, j = e % kTile;
      const int64_t qi = q0 + i, kj = k0 + j;
      const bool visible = i < rows && kj <= qi && kj >= seg[row0 + qi];
      float ds = 0.0f;
      if (visible) {
        const float p = expf(dot(Qs + i * ld, Ks + j * ld, d) * s.scale - L[i]);
        const float dp = dot(dOs + i * ld, Vs + j * ld, d);
        ds = p * (dp - D[i]);
      }
      Ps[i * kLd + j] = rnd<BF16>(ds);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
      const int64_t i = e / d, c = e % d;
      float acc = 0.0f;
      for (int j = 0; j < kTile; ++j) acc += Ps[i * kLd + j] * Ks[j * ld + c];
      dQs[i * ld + c] += acc;
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int64_t i = e / d, c = e % d;
    dq[(row0 + q0 + i) * s.Hq * d + h * d + c] = dQs[i * ld + c] * s.scale;
  }
}

// dk, dv over key tiles (one block: 32 keys of kv head g, all its query heads).
template <bool BF16>
__global__ void dkv_k(AttnShape s, const float* q, const float* k, const float* v, const float* lse,
                      const float* dout, const int32_t* seg, const float* delta, float* dk,
                      float* dv) {
  extern __shared__ float sm[];
  const int64_t d = s.d, ld = d + 1, b = blockIdx.z, g = blockIdx.y, k0 = blockIdx.x * kTile;
  const int64_t rep = s.Hq / s.Hkv, row0 = b * s.S, ld_o = s.Hq * d;
  float* Ks = sm;
  float* Vs = Ks + kTile * ld;
  float* dKs = Vs + kTile * ld;
  float* dVs = dKs + kTile * ld;
  float* Qs = dVs + kTile * ld;
  float* dOs = Qs + kTile * ld;
  float* Ps = dOs + kTile * ld;  // [32 queries][kLd]
  float* Ss = Ps + kTile * kLd;  // dS
  __shared__ float L[kTile], D[kTile];
  __shared__ int32_t seg_s[kTile];
  const int64_t keys = s.S - k0 < kTile ? s.S - k0 : kTile;
  load_tile<BF16>(Ks, k, row0, k0, s.S, s.ldk, g * d, d);
  load_tile<BF16>(Vs, v, row0, k0, s.S, s.ldv, g * d, d);
  for (int64_t e = threadIdx.x; e < kTile * ld; e += blockDim.x) dKs[e] = dVs[e] = 0.0f;
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
    for (int64_t q0 = k0; q0 < s.S; q0 += kTile) {
      // Segment starts only grow along a row: once a tile's first query starts its document
      // after the last key, no later query sees these keys (the CPU's qt_end). The same value
      // for every thread, so all leave the loop together.
      if (seg[row0 + q0] > k0 + keys - 1) break;
      const int64_t rows = s.S - q0 < kTile ? s.S - q0 : kTile;
      __syncthreads();  // the previous tile's readers are done
      load_tile<BF16>(Qs, q, row0, q0, s.S, s.ldq, h * d, d);
      load_tile<BF16>(dOs, dout, row0, q0, s.S, ld_o, h * d, d);
      if (threadIdx.x < kTile) {
        const bool in = threadIdx.x < rows;
        L[threadIdx.x] = in ? lse[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
        D[threadIdx.x] = in ? delta[(b * s.Hq + h) * s.S + q0 + threadIdx.x] : 0.0f;
        seg_s[threadIdx.x] = in ? seg[row0 + q0 + threadIdx.x] : 0;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
        const int i = e / kTile, j = e % kTile;
        const int64_t qi = q0 + i, kj = k0 + j;
        const bool visible = i < rows && j < keys && kj <= qi && kj >= seg_s[i];
        float p = 0.0f, ds = 0.0f;
        if (visible) {
          p = expf(dot(Qs + i * ld, Ks + j * ld, d) * s.scale - L[i]);
          ds = p * (dot(dOs + i * ld, Vs + j * ld, d) - D[i]);
        }
        Ps[i * kLd + j] = rnd<BF16>(p);
        Ss[i * kLd + j] = rnd<BF16>(ds);
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
        const int64_t j = e / d, c = e % d;
        float av = 0.0f, ak = 0.0f;
        for (int i = 0; i < kTile; ++i) {
          av += Ps[i * kLd + j] * dOs[i * ld + c];
          ak += Ss[i * kLd + j] * Qs[i * ld + c];
        }
        dVs[j * ld + c] += av;
        dKs[j * ld + c] += ak;
      }
    }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < keys * d; e += blockDim.x) {
    const int64_t j = e / d, c = e % d;
    dk[(row0 + k0 + j) * s.ldk + g * d + c] = dKs[j * ld + c] * s.scale;
    dv[(row0 + k0 + j) * s.ldv + g * d + c] = dVs[j * ld + c];
  }
}

__global__ void segments_k(const int32_t* positions, int64_t B, int64_t S, bool block_causal,
                           int32_t* seg) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < B * S;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = t / S, i = t % S;
    int64_t start = 0;
    if (block_causal)
      for (int64_t j = i; j > 0; --j)
        if (positions[b * S + j] == 0) {
          start = j;
          break;
        }
    seg[t] = static_cast<int32_t>(start);
  }
}

// One block per (token t, query head h), kCached threads: t's n keys in chunks of kCached, one
// score per thread, with an online softmax (the running maximum m and sum l rescaled by
// exp(m_old − m_new) per chunk, as fwd_k) and the weighted sum of v in registers (columns c and
// c + kCached of head_dim ≤ 2·kCached per thread). No scratch beyond one chunk's
// probabilities, however long the cache.
constexpr int kCached = 128;
__global__ void cached_k(const float* q, int64_t ldq, const float* const* k, const float* const* v,
                         const int32_t* n_keys, int64_t ldkv, int64_t Hq, int64_t Hkv, int64_t d,
                         float scale, float* o) {
  __shared__ float pc[kCached];
  const int64_t th = blockIdx.x, t = th / Hq, h = th % Hq, g = h / (Hq / Hkv), n = n_keys[t];
  const float* qi = q + t * ldq + h * d;
  const float* kt = k[t] + g * d;
  const float* vt = v[t] + g * d;
  float m = -INFINITY, l = 0.0f, acc[2] = {0.0f, 0.0f};
  for (int64_t j0 = 0; j0 < n; j0 += kCached) {  // the same trip count in every thread
    const int64_t j = j0 + threadIdx.x, keys = n - j0 < kCached ? n - j0 : kCached;
    const float sc = j < n ? dot(qi, kt + j * ldkv, d) * scale : -INFINITY;
    const float m_new = fmaxf(m, block_max(sc));  // finite: the chunk has a key
    const float e = j < n ? expf(sc - m_new) : 0.0f, alpha = expf(m - m_new);
    pc[threadIdx.x] = e;
    l = l * alpha + block_sum(e);  // block_sum's barrier also publishes pc
    for (int r = 0; r < 2; ++r) {
      const int64_t c = threadIdx.x + r * kCached;
      if (c >= d) break;
      float a = 0.0f;
      for (int64_t jj = 0; jj < keys; ++jj) a += pc[jj] * vt[(j0 + jj) * ldkv + c];
      acc[r] = acc[r] * alpha + a;
    }
    m = m_new;
    __syncthreads();  // pc is rewritten by the next chunk
  }
  const float inv = 1.0f / l;
  for (int r = 0; r < 2; ++r) {
    const int64_t c = threadIdx.x + r * kCached;
    if (c < d) o[t * Hq * d + h * d + c] = acc[r] * inv;
  }
}

// Allows a kernel the dynamic shared memory its tiles take (beyond the default 48 KiB).
template <typename K>
void allow_shared(K kernel, size_t bytes) {
  TITAN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
}

void check_shape(const AttnShape& s, const char* what) {
  check(s.d > 0 && s.d <= 256 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
        std::string(what) + ": head_dim " + std::to_string(s.d) + " (at most 256) and " +
            std::to_string(s.Hq) + " query heads over " + std::to_string(s.Hkv) +
            " kv heads are not supported by the CUDA attention");
  check(s.keys() == s.S && s.q0 == 0 && !s.accumulate,
        std::string(what) + ": queries that are part of a longer key sequence (context "
                            "parallelism) run on the CPU backend only");
}

template <bool BF16>
void fwd(const AttnShape& s, const float* q, const float* k, const float* v, const int32_t* seg,
         float* o, float* lse) {
  check_shape(s, "attention_fwd");
  if (s.B * s.S == 0) return;
  if (BF16 && attention_tc_supports(s)) {  // head_dim 64 or 128: tensor cores
    attention_fwd_tc(s, q, k, v, seg, o, lse);
    return;
  }
  const size_t shared = sizeof(float) * (4 * kTile * (s.d + 1) + kTile * kLd);
  allow_shared(fwd_k<BF16>, shared);
  const dim3 grid(static_cast<unsigned>((s.S + kTile - 1) / kTile), static_cast<unsigned>(s.Hq),
                  static_cast<unsigned>(s.B));
  fwd_k<BF16><<<grid, kThreads, shared, stream()>>>(s, q, k, v, seg, o, lse);
  TITAN_CUDA_LAUNCHED("attention_fwd");
}

template <bool BF16>
void bwd(const AttnShape& s, const float* q, const float* k, const float* v, const float* o,
         const float* lse, const float* dout, const int32_t* seg, float* dq, float* dk, float* dv,
         float* delta) {
  check_shape(s, "attention_bwd");
  if (s.B * s.S == 0) return;
  const int64_t warps = s.B * s.Hq * s.S;
  delta_k<<<blocks_for(warps * 32, kThreads), kThreads, 0, stream()>>>(s, o, dout, delta);
  TITAN_CUDA_LAUNCHED("attention_bwd (delta)");
  if (BF16 && attention_tc_supports(s)) {
    attention_bwd_tc(s, q, k, v, lse, dout, seg, delta, dq, dk, dv);
    return;
  }
  const unsigned tiles = static_cast<unsigned>((s.S + kTile - 1) / kTile);
  const size_t dq_shared = sizeof(float) * (5 * kTile * (s.d + 1) + kTile * kLd);
  allow_shared(dq_k<BF16>, dq_shared);
  dq_k<BF16><<<dim3(tiles, static_cast<unsigned>(s.Hq), static_cast<unsigned>(s.B)), kThreads,
               dq_shared, stream()>>>(s, q, k, v, lse, dout, seg, delta, dq);
  TITAN_CUDA_LAUNCHED("attention_bwd (dq)");
  const size_t kv_shared = sizeof(float) * (6 * kTile * (s.d + 1) + 2 * kTile * kLd);
  allow_shared(dkv_k<BF16>, kv_shared);
  dkv_k<BF16><<<dim3(tiles, static_cast<unsigned>(s.Hkv), static_cast<unsigned>(s.B)), kThreads,
                kv_shared, stream()>>>(s, q, k, v, lse, dout, seg, delta, dk, dv);
  TITAN_CUDA_LAUNCHED("attention_bwd (dk, dv)");
}

}  // namespace

void attention_segments(const int32_t* positions, int64_t B, int64_t S, bool block_causal,
                        int32_t* seg_start) {
  if (B * S == 0) return;
  segments_k<<<blocks_for(B * S, kThreads), kThreads, 0, stream()>>>(positions, B, S, block_causal,
                                                                     seg_start);
  TITAN_CUDA_LAUNCHED("attention_segments");
}

void attention_cached(const float* q, int64_t ldq, const float* const* k, const float* const* v,
                      const int32_t* n_keys, int64_t ldkv, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t d, float scale, float* o) {
  if (T * Hq <= 0) return;
  check_shape(AttnShape{1, 1, Hq, Hkv, d, scale, ldq, ldkv, ldkv}, "attention_cached");
  cached_k<<<static_cast<unsigned>(T * Hq), kCached, 0, stream()>>>(q, ldq, k, v, n_keys, ldkv, Hq,
                                                                    Hkv, d, scale, o);
  TITAN_CUDA_LAUNCHED("attention_cached");
}

void attention_fwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const int32_t* seg_start, float* o, float* lse, float* /*workspace*/) {
  fwd<false>(s, q, k, v, seg_start, o, lse);
}

void attention_bwd(const AttnShape& s, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dout, const int32_t* seg_start,
                   float* dq, float* dk, float* dv, float* delta, float* /*workspace*/) {
  bwd<false>(s, q, k, v, o, lse, dout, seg_start, dq, dk, dv, delta);
}

void attention_fwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const int32_t* seg_start, float* o, float* lse, float* /*workspace*/) {
  fwd<true>(s, q, k, v, seg_start, o, lse);
}

void attention_bwd_bf16(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dout,
                        const int32_t* seg_start, float* dq, float* dk, float* dv, float* delta,
                        float* /*workspace*/) {
  bwd<true>(s, q, k, v, o, lse, dout, seg_start, dq, dk, dv, delta);
}

}  // namespace titan::ops::cuda
