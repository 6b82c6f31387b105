// The grouped-experts op on the GPU ("grouped_experts" under device cuda, float32 or bfloat16;
// ops/experts_op.h's contract), the CPU op's algorithm (ops/cpu/experts.cpp) step for step:
// the N = T·K (token, slot) pairs sorted by expert, stable in token order (a counting sort on the
// GPU, no atomics: one block per expert counts its pairs, then ranks them with warp ballots in
// pair order; only the E + 1 offsets come back to the host, where they drive one cuBLASLt GEMM
// per expert and projection);
// xp = x's rows permuted; h = [xp·W1ᵀ | xp·W3ᵀ]; g = silu ⊙ up; yp = g·W2ᵀ; y[t] = Σ_j w·yp in
// slot order (no atomics). Backward as the CPU's (dw from dgu·g, dW2 from du and gw, swiglu_bwd,
// dxp, dW1 and dW3, dx summed in slot order). bf16: each GEMM's activation operand rounded to
// bf16, the weights' bf16 copies.
// saved: h [N·2F] | off [E+1] | bad [1] | counts [E] | pos [N], int32 (device; bad: the first pair
// whose expert index is outside [0, E), or N); scratch: as the CPU op's, plus the bf16 copies.
#include <string>
#include <vector>

#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {
namespace {

constexpr int kThreads = 256;
int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

int64_t saved_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return round16(N * 2 * s.F) + round16(2 * s.E + 2 + N);
}
int64_t scratch_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return 2 * round16(N * s.D) + 2 * round16(N * s.F) + round16(N * 2 * s.F);
}
// bf16 copies after the fp32 parts: xp [N·D] | du [N·D] | g or gw [N·F] | dh [N·2F].
int64_t bf16_scratch_floats(const ExpertsShape& s) {
  const int64_t N = s.T * s.K;
  return scratch_floats(s) + (2 * round16(2 * N * s.D) + 3 * round16(2 * N * s.F)) / 2;
}

struct Parts {
  float* h;
  int32_t *off, *counts, *pos;  // device (off is followed by bad)
  std::vector<int32_t> off_host;
};

Parts parts(const ExpertsShape& s, float* saved) {
  const int64_t N = s.T * s.K;
  Parts p;
  p.h = saved;
  p.off = reinterpret_cast<int32_t*>(saved + round16(N * 2 * s.F));
  p.counts = p.off + s.E + 2;
  p.pos = p.counts + s.E;
  return p;
}

// The integer sum (or minimum) of v over the block (blockDim.x a multiple of 32), to every thread.
template <bool Min>
__device__ int32_t block_reduce_int(int32_t v) {
  __shared__ int32_t part[32];
  auto op = [](int32_t a, int32_t b) { return Min ? min(a, b) : a + b; };
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t r = part[0];
    for (int w = 1; w < warps; ++w) r = op(r, part[w]);
    part[0] = r;
  }
  __syncthreads();
  const int32_t r = part[0];
  __syncthreads();
  return r;
}

// Block e < E: counts[e] = #{i : id[i] = e}; block E: *bad = the first i with id[i] outside
// [0, E), or N.
__global__ void count_k(const int32_t* id, int32_t N, int32_t E, int32_t* counts, int32_t* bad) {
  const int32_t e = blockIdx.x;
  int32_t acc = e == E ? N : 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const int32_t v = id[i];
    if (e < E)
      acc += v == e;
    else if ((v < 0 || v >= E) && i < acc)
      acc = static_cast<int32_t>(i);
  }
  if (e < E) {
    acc = block_reduce_int<false>(acc);
    if (threadIdx.x == 0) counts[e] = acc;
  } else {
    acc = block_reduce_int<true>(acc);
    if (threadIdx.x == 0) *bad = acc;
  }
}

// Block e: off[e] = Σ counts[<e] (and off[E] from the last block); pos[i] = off[e] + the number of
// pairs before i routed to e, for each i routed to e (the chunk's ranks from warp ballots).
__global__ void position_k(const int32_t* id, int32_t N, int32_t E, const int32_t* counts,
                           int32_t* off, int32_t* pos) {
  __shared__ int32_t warp_hits[32];
  const int32_t e = blockIdx.x;
  int32_t base = 0;
  for (int32_t q = threadIdx.x; q < e; q += blockDim.x) base += counts[q];
  base = block_reduce_int<false>(base);
  if (threadIdx.x == 0) {
    off[e] = base;
    if (e == E - 1) off[E] = base + counts[e];
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t c = 0; c < N; c += blockDim.x) {
    const int64_t i = c + threadIdx.x;
    const bool hit = i < N && id[i] == e;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[warp] = __popc(m);
    __syncthreads();
    int32_t before = 0, total = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warp_hits[w] : 0;
      total += warp_hits[w];
    }
    if (hit) pos[i] = base + before + __popc(m & ((1u << lane) - 1u));
    base += total;
    __syncthreads();  // warp_hits is rewritten by the next chunk
  }
}

// xp[pos(t,j)] = x[t].
__global__ void scatter_k(const int32_t* pos, const float* x, int64_t T, int64_t K, int64_t D,
                          float* xp) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < T * K * D;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % D, pair = e / D, t = pair / K;
    xp[static_cast<int64_t>(pos[pair]) * D + c] = x[t * D + c];
  }
}

// y[t] = Σ_j w[t,j]·yp[pos(t,j)] (weighted) or dx[t] = Σ_j dxp[pos(t,j)], in slot order.
__global__ void combine_k(const int32_t* pos, const float* w, const float* rows, int64_t T,
                          int64_t K, int64_t D, float* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < T * D;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / D, c = e % D;
    float acc = w ? w[t * K] * rows[static_cast<int64_t>(pos[t * K]) * D + c]
                  : rows[static_cast<int64_t>(pos[t * K]) * D + c];
    for (int64_t j = 1; j < K; ++j) {
      const float r = rows[static_cast<int64_t>(pos[t * K + j]) * D + c];
      acc += w ? w[t * K + j] * r : r;
    }
    out[e] = acc;
  }
}

// Per pair (one warp): dw[t,j] = dg[p]·g[p]; then dg[p] and g[p] scaled by w[t,j].
__global__ void weight_k(const int32_t* pos, const float* w, int64_t N, int64_t F, float* dg,
                         float* g, float* dw) {
  const int64_t pair = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= N) return;
  float* dgp = dg + static_cast<int64_t>(pos[pair]) * F;
  float* gp = g + static_cast<int64_t>(pos[pair]) * F;
  float acc = 0.0f;
  for (int64_t c = lane; c < F; c += 32) acc += dgp[c] * gp[c];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) dw[pair] = acc;
  __syncwarp();
  const float wt = w[pair];
  for (int64_t c = lane; c < F; c += 32) {
    dgp[c] *= wt;
    gp[c] *= wt;
  }
}

unsigned grid(int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

void check_shape(const ExpertsShape& s) {
  check(s.T >= 0 && s.D > 0 && s.F > 0 && s.E > 0 && s.K > 0 && s.T * s.K < (int64_t{1} << 31),
        "grouped_experts (cuda): need T >= 0, positive D, F, E, K and T·K < 2^31 (got T=" +
            std::to_string(s.T) + " D=" + std::to_string(s.D) + " F=" + std::to_string(s.F) +
            " E=" + std::to_string(s.E) + " K=" + std::to_string(s.K) + ")");
}

void check_args(const ExpertsArgs& a, bool bf16) {
  check_shape(a.s);
  check(!bf16 || (a.w1_bf16 && a.w3_bf16 && a.w2_bf16),
        "grouped_experts (cuda, bfloat16) needs the bf16 weight copies (ExpertsArgs::w*_bf16)");
}

// The counting sort of the pairs by expert on the GPU into saved's off and pos; off (and the bad
// pair's index) copied to the host.
void route(const ExpertsShape& s, const int32_t* idx, Parts& p) {
  const auto N = static_cast<int32_t>(s.T * s.K), E = static_cast<int32_t>(s.E);
  int32_t* bad = p.off + E + 1;
  count_k<<<E + 1, kThreads, 0, stream()>>>(idx, N, E, p.counts, bad);
  position_k<<<E, kThreads, 0, stream()>>>(idx, N, E, p.counts, p.off, p.pos);
  TITAN_CUDA_LAUNCHED("grouped_experts (routing)");
  p.off_host.resize(static_cast<size_t>(E) + 2);
  copy(p.off_host.data(), p.off, sizeof(int32_t) * p.off_host.size());
  const int32_t first_bad = p.off_host.back();
  p.off_host.pop_back();
  if (first_bad == N) return;
  int32_t e = 0;
  copy(&e, idx + first_bad, sizeof e);
  throw Error("grouped_experts: expert index " + std::to_string(e) + " of token " +
              std::to_string(first_bad / s.K) + " slot " + std::to_string(first_bad % s.K) +
              " is outside [0, " + std::to_string(s.E) + ")");
}

// One expert GEMM: fp32 operands, or their bf16 copies.
void expert_gemm(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a,
                 const uint16_t* ab, int64_t lda, const float* b, const uint16_t* bb, int64_t ldb,
                 float* c, int64_t ldc, bool acc) {
  if (bf16)
    gemm_bf16(ta, tb, M, N, K, ab, lda, bb, ldb, c, ldc, acc);
  else
    gemm(ta, tb, M, N, K, a, lda, b, ldb, c, ldc, acc);
}
template <typename T>
T* at(T* p, int64_t i) {
  return p ? p + i : nullptr;
}

struct Bf16 {
  uint16_t *xp = nullptr, *du = nullptr, *g = nullptr, *dh = nullptr;
};
Bf16 bf16_parts(const ExpertsShape& s, float* scratch) {
  const int64_t N = s.T * s.K;
  Bf16 b;
  b.xp = reinterpret_cast<uint16_t*>(scratch + scratch_floats(s));
  b.du = b.xp + round16(2 * N * s.D);
  b.g = b.du + round16(2 * N * s.D);
  b.dh = b.g + round16(2 * N * s.F);
  return b;
}

void forward(const ExpertsArgs& a, float* y, bool bf16) {
  const ExpertsShape& s = a.s;
  check_args(a, bf16);
  if (s.T == 0) return;
  const int64_t N = s.T * s.K, D = s.D, F = s.F;
  Parts p = parts(s, a.saved);
  route(s, a.idx, p);
  float* xp = a.scratch;
  float* yp = xp + round16(N * D);
  float* g = yp + round16(N * D);
  const Bf16 b = bf16 ? bf16_parts(s, a.scratch) : Bf16{};
  scatter_k<<<grid(N * D), kThreads, 0, stream()>>>(p.pos, a.x, s.T, s.K, D, xp);
  TITAN_CUDA_LAUNCHED("grouped_experts (scatter)");
  if (bf16) to_bf16(xp, N * D, b.xp);
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t o = p.off_host[e], n = p.off_host[e + 1] - o;
    if (n == 0) continue;
    expert_gemm(bf16, false, true, n, F, D, xp + o * D, at(b.xp, o * D), D, a.w1 + e * F * D,
                at(a.w1_bf16, e * F * D), D, p.h + o * 2 * F, 2 * F, false);
    expert_gemm(bf16, false, true, n, F, D, xp + o * D, at(b.xp, o * D), D, a.w3 + e * F * D,
                at(a.w3_bf16, e * F * D), D, p.h + o * 2 * F + F, 2 * F, false);
  }
  swiglu_fwd(p.h, g, N, F);
  if (bf16) to_bf16(g, N * F, b.g);
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t o = p.off_host[e], n = p.off_host[e + 1] - o;
    if (n == 0) continue;
    expert_gemm(bf16, false, true, n, D, F, g + o * F, at(b.g, o * F), F, a.w2 + e * D * F,
                at(a.w2_bf16, e * D * F), F, yp + o * D, D, false);
  }
  combine_k<<<grid(s.T * D), kThreads, 0, stream()>>>(p.pos, a.w, yp, s.T, s.K, D, y);
  TITAN_CUDA_LAUNCHED("grouped_experts (combine)");
}

void backward(const ExpertsArgs& a, const ExpertsGrads& gr, bool bf16) {
  const ExpertsShape& s = a.s;
  check_args(a, bf16);
  if (s.T == 0) return;
  const int64_t N = s.T * s.K, D = s.D, F = s.F;
  Parts p = parts(s, a.saved);
  p.off_host.resize(static_cast<size_t>(s.E + 1));
  copy(p.off_host.data(), p.off, sizeof(int32_t) * p.off_host.size());
  float* xp = a.scratch;
  float* du = xp + round16(N * D);  // later dxp
  float* g = du + round16(N * D);   // later gw
  float* dg = g + round16(N * F);
  float* dh = dg + round16(N * F);
  const Bf16 b = bf16 ? bf16_parts(s, a.scratch) : Bf16{};
  scatter_k<<<grid(N * D), kThreads, 0, stream()>>>(p.pos, a.x, s.T, s.K, D, xp);
  scatter_k<<<grid(N * D), kThreads, 0, stream()>>>(p.pos, gr.dy, s.T, s.K, D, du);
  TITAN_CUDA_LAUNCHED("grouped_experts (scatter)");
  if (bf16) to_bf16(du, N * D, b.du);
  swiglu_fwd(p.h, g, N, F);
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t o = p.off_host[e], n = p.off_host[e + 1] - o;
    if (n == 0) continue;
    expert_gemm(bf16, false, false, n, F, D, du + o * D, at(b.du, o * D), D, a.w2 + e * D * F,
                at(a.w2_bf16, e * D * F), F, dg + o * F, F, false);
  }
  weight_k<<<blocks_for(N * 32, kThreads), kThreads, 0, stream()>>>(p.pos, a.w, N, F, dg, g, gr.dw);
  TITAN_CUDA_LAUNCHED("grouped_experts (routing weights)");
  if (bf16) to_bf16(g, N * F, b.g);
  for (int64_t e = 0; e < s.E && gr.dw2; ++e) {
    const int64_t o = p.off_host[e], n = p.off_host[e + 1] - o;
    if (n == 0) continue;
    expert_gemm(bf16, true, false, D, F, n, du + o * D, at(b.du, o * D), D, g + o * F,
                at(b.g, o * F), F, gr.dw2 + e * D * F, F, true);
  }
  swiglu_bwd(dg, p.h, dh, N, F);
  if (bf16) {
    to_bf16(dh, N * 2 * F, b.dh);
    to_bf16(xp, N * D, b.xp);
  }
  float* dxp = du;
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t o = p.off_host[e], n = p.off_host[e + 1] - o;
    if (n == 0) continue;
    const float* dha = dh + o * 2 * F;
    const uint16_t* dhb = at(b.dh, o * 2 * F);
    const uint16_t* xpb = at(b.xp, o * D);
    expert_gemm(bf16, false, false, n, D, F, dha, dhb, 2 * F, a.w1 + e * F * D,
                at(a.w1_bf16, e * F * D), D, dxp + o * D, D, false);
    expert_gemm(bf16, false, false, n, D, F, dha + F, at(dhb, F), 2 * F, a.w3 + e * F * D,
                at(a.w3_bf16, e * F * D), D, dxp + o * D, D, true);
    if (!gr.dw1) continue;  // frozen experts
    expert_gemm(bf16, true, false, F, D, n, dha, dhb, 2 * F, xp + o * D, xpb, D, gr.dw1 + e * F * D,
                D, true);
    expert_gemm(bf16, true, false, F, D, n, dha + F, at(dhb, F), 2 * F, xp + o * D, xpb, D,
                gr.dw3 + e * F * D, D, true);
  }
  combine_k<<<grid(s.T * D), kThreads, 0, stream()>>>(p.pos, nullptr, dxp, s.T, s.K, D, gr.dx);
  TITAN_CUDA_LAUNCHED("grouped_experts (dx)");
}

}  // namespace

GroupedExpertsOp grouped_experts_op(bool bf16) {
  GroupedExpertsOp op;
  op.name = "grouped_experts";
  op.device = "cuda";
  op.dtype = bf16 ? "bfloat16" : "float32";
  op.saved_floats = saved_floats;
  op.scratch_floats = bf16 ? bf16_scratch_floats : scratch_floats;
  op.forward = [bf16](const ExpertsArgs& a, float* y) { forward(a, y, bf16); };
  op.backward = [bf16](const ExpertsArgs& a, const ExpertsGrads& g) { backward(a, g, bf16); };
  op.check = check_shape;
  return op;
}

}  // namespace titan::ops::cuda
