// Row-wise kernels of the Qwen3 block, each a forward and the backward that differentiates it.
// Shapes: T tokens, D model dim, H heads, d head_dim, F ffn hidden, V vocab. All fp32, row-major.
#pragma once
#include <cstdint>

namespace titan::ops {

// ---- Embedding: out[T,D] = table[ids[t], :]. Throws titan::Error if an id is outside [0,V).
void embedding_fwd(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t D,
                   float* out);
// Backward of embedding_fwd: dtable[ids[t], :] += dout[t, :]. Deterministic (column-parallel).
void embedding_bwd(const int32_t* ids, int64_t T, const float* dout, int64_t D, float* dtable);
// The vocabulary-parallel form (tensor parallelism: this rank holds table rows [v0, v0 + vl),
// `table` pointing at row v0): out[t] = table[ids[t] − v0] for ids in the range, zeros for the
// others (ids outside [0, V) throw as embedding_fwd's); the backward adds dout[t] to the rows of
// the ids in the range only, each row's tokens in order (embedding_bwd's sums).
void embedding_fwd_range(const int32_t* ids, int64_t T, const float* table, int64_t V, int64_t v0,
                         int64_t vl, int64_t D, float* out);
void embedding_bwd_range(const int32_t* ids, int64_t T, const float* dout, int64_t v0, int64_t vl,
                         int64_t D, float* dtable);

// ---- RMSNorm over rows of length N (HF Qwen3RMSNorm, fp32): y = w ⊙ x·rstd,
// rstd = 1/sqrt(mean(x²) + eps). Rows are (t, h) for t < T, h < H: row (t,h) of x starts at
// x + t·ldx + h·N (same for y with ldy). H = 1 and ld = N for an ordinary [T,N] norm;
// H = heads, N = d for the per-head q_norm/k_norm. rstd[T·H] is saved for the backward.
struct NormRows {
  int64_t T, H, N, ldx, ldy;
};
void rmsnorm_fwd(const NormRows& s, const float* x, const float* w, float eps, float* y,
                 float* rstd);
// Backward of rmsnorm_fwd: dx (written, rows laid out like x with ldx; dy like y with ldy)
//   dx = rstd·(g - x̂·mean(g ⊙ x̂)),  g = dy ⊙ w,  x̂ = x·rstd;  dw[N] += Σ_rows dy ⊙ x̂
//   (dw null: a frozen weight, no gradient).
// scratch: rmsnorm_bwd_scratch(s) floats, for a deterministic reduction of dw.
int64_t rmsnorm_bwd_scratch(const NormRows& s);
void rmsnorm_bwd(const NormRows& s, const float* dy, const float* x, const float* w,
                 const float* rstd, float* dx, float* dw, float* scratch);

// ---- RoPE, half-split (GPT-NeoX / HF rotate_half): pairs (j, j + d/2), angle pos·θ^(-2j/d).
// Table layout: cos_sin[p, 0:d/2] = cos, cos_sin[p, d/2:d] = sin, for p < max_pos (fp32).
void rope_table(int64_t max_pos, int64_t d, double theta, float* cos_sin);
// The index of the first t < n with pos[t] outside [0, limit) (a position past the RoPE table),
// or -1 when every position is inside. The model's check of a batch's positions.
int64_t first_bad_position(const int32_t* pos, int64_t n, int64_t limit);
// x[T, H, d] (token stride ldx) rotated in place by the angle of positions[t].
void rope_fwd(float* x, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin);
// Backward of rope_fwd (the inverse rotation), in place on dx laid out like x.
void rope_bwd(float* dx, int64_t T, int64_t H, int64_t d, int64_t ldx, const int32_t* positions,
              const float* cos_sin);

// The two functions above as the built-in RoPE op ("cos_sin_rope") that modules call.
struct RopeOp;
RopeOp cos_sin_rope_op();

// ---- SwiGLU: ab[T, 2F] holds a = w1·x (gate) in columns [0,F) and b = w3·x (up) in [F,2F);
// g[T,F] = silu(a) ⊙ b.
void swiglu_fwd(const float* ab, float* g, int64_t T, int64_t F);
// Backward of swiglu_fwd: dab[:, :F] = dg ⊙ b ⊙ silu'(a), dab[:, F:] = dg ⊙ silu(a).
void swiglu_bwd(const float* dg, const float* ab, float* dab, int64_t T, int64_t F);

// ---- Vector helpers. out = a + b (residual add), y += x, and x *= s (LoRA's scaling).
void add(const float* a, const float* b, float* out, int64_t n);
void add_inplace(float* y, const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);

// ---- Row moves (expert parallelism's dispatch and combine, train/expert_parallel.h), rows of
// `width` floats at a stride, indices int32 (null: the identity):
// copy_rows:  dst[dst_row[i]·dst_stride + c] = src[src_row[i]·src_stride + c], i < n, c < width;
// sum_rows:   dst[t·width + c] = 0 + Σ_{j<k} src[index[t·k + j]·src_stride + c] (j in order),
//             t < n: the rows of each group of k summed in a fixed order.
void copy_rows(const float* src, int64_t src_stride, const int32_t* src_row, float* dst,
               int64_t dst_stride, const int32_t* dst_row, int64_t n, int64_t width);
void sum_rows(const float* src, int64_t src_stride, const int32_t* index, int64_t k, float* dst,
              int64_t n, int64_t width);

// ---- Inverted dropout with counter-based masks (LoRA's): element k is kept iff
// uniform_open(random_u64(seed, stream, k)) >= p (core/rng.h), kept values scaled by
// keep = float(1 / (1 − p)). dropout: y[k] = kept ? x[k]·keep : 0. dropout_add (its backward
// into an accumulating gradient): y[k] += x[k]·keep where kept, y[k] untouched elsewhere.
void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p);
void dropout_add(const float* x, float* y, int64_t n, uint64_t seed, uint64_t stream, double p);

// ---- bf16 rounding of activations for the mixed-precision GEMMs: y[i] = bf16(x[i]) (raw bit
// pattern), round to nearest even, NaN kept quiet with its sign, ±inf kept; bitwise the same as
// core/dtype.h's f32_to(DType::BF16, ...), parallel and vectorized.
void to_bf16(const float* x, int64_t n, uint16_t* y);
// Its inverse on bf16 bit patterns: y[i] = the fp32 value of x[i] (exact: the bits shifted up);
// FSDP widens a unit gathered in bf16 into the fp32 parameters with it (train/fsdp.h).
void from_bf16(const uint16_t* x, int64_t n, float* y);

}  // namespace titan::ops
