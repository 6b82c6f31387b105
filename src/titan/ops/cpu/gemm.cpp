#include "titan/ops/gemm.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"
#include "titan/core/buffer.h"
#include "titan/core/dtype.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/simd.h"

namespace titan::ops {
namespace {

using dnnl::memory;
// (trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, bf16 inputs)
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;

struct Entry {
  dnnl::matmul prim;
  memory a, b, c, scratch;
  Buffer<uint8_t> scratch_buf;
  std::unordered_map<int, memory> args;
};

// gemm_rows: M and K are runtime dimensions, so the key leaves them out.
// (trans_a, trans_b, N, lda, ldb, ldc, accumulate, bf16 inputs)
using RowsKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, bool, bool>;

struct RowsEntry {
  dnnl::matmul prim;
  memory scratch;
  Buffer<uint8_t> scratch_buf;
};

// Primitives cached by all threads together (gemm_cache_size).
std::atomic<int64_t> g_cached{0};

struct Context {
  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { g_cached -= static_cast<int64_t>(cache.size() + rows_cache.size()); }
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::map<RowsKey, std::unique_ptr<RowsEntry>> rows_cache;
  // gemm_bf16's converting path: fp32 copies of the bf16 operands, grown to the largest seen.
  Buffer<float> conv_a, conv_b;
  Buffer<float> gemv_a;  // gemv's bf16 rows of A, widened
  int bf16_native = -1;  // -1: not yet probed; 0: converting path; 1: oneDNN bf16 primitives
};

// One per thread (see gemm.h): the primitives' scratchpads and memory objects must not be shared
// by products that run at once.
Context& ctx() {
  static thread_local Context c;
  return c;
}

// The matmul primitive descriptor of one Key (throws dnnl::error when oneDNN has no
// implementation, e.g. bf16 on a CPU without AVX512).
// Memory descriptors of A[M,K], B[K,N], C[M,N] (dims M or K may be DNNL_RUNTIME_DIM_VAL): A and
// B fp32 or bf16, stored [rows, ld] or transposed (read through strides); C fp32.
struct Mds {
  memory::desc a, b, c;
};
Mds make_mds(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
             int64_t ldc, bool bf16) {
  const auto f32 = memory::data_type::f32;
  const auto in = bf16 ? memory::data_type::bf16 : f32;
  return {memory::desc({M, K}, in, ta ? memory::dims{1, lda} : memory::dims{lda, 1}),
          memory::desc({K, N}, in, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1}),
          memory::desc({M, N}, f32, memory::dims{ldc, 1})};
}

// A user-managed scratchpad, and C += when accumulating (a sum post-op).
dnnl::primitive_attr make_attr(bool accumulate) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  return attr;
}

// The matmul primitive descriptor of one Key (throws dnnl::error when oneDNN has no
// implementation, e.g. bf16 on a CPU without AVX512).
dnnl::matmul::primitive_desc make_pd(const Key& key) {
  auto [ta, tb, M, N, K, lda, ldb, ldc, acc, bf16] = key;
  const Mds md = make_mds(ta, tb, M, N, K, lda, ldb, ldc, bf16);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(md.a, md.b, md.c), make_attr(acc),
                                      ctx().engine);
}

Entry& lookup(const Key& key) {
  Context& c = ctx();
  auto it = c.cache.find(key);
  if (it != c.cache.end()) return *it->second;
  const dnnl::matmul::primitive_desc pd = make_pd(key);
  const memory::desc a_md = pd.src_desc(), b_md = pd.weights_desc(), c_md = pd.dst_desc();
  auto e = std::make_unique<Entry>();
  e->prim = dnnl::matmul(pd);
  e->a = memory(a_md, c.engine, DNNL_MEMORY_NONE);
  e->b = memory(b_md, c.engine, DNNL_MEMORY_NONE);
  e->c = memory(c_md, c.engine, DNNL_MEMORY_NONE);
  size_t sbytes = pd.scratchpad_desc().get_size();
  e->scratch_buf.resize(static_cast<int64_t>(sbytes > 0 ? sbytes : 64));
  e->scratch = memory(pd.scratchpad_desc(), c.engine, e->scratch_buf.data());
  e->args = {{DNNL_ARG_SRC, e->a},
             {DNNL_ARG_WEIGHTS, e->b},
             {DNNL_ARG_DST, e->c},
             {DNNL_ARG_SCRATCHPAD, e->scratch}};
  Entry& ref = *e;
  c.cache.emplace(key, std::move(e));
  ++g_cached;
  return ref;
}

RowsEntry& lookup_rows(const RowsKey& key) {
  Context& c = ctx();
  auto it = c.rows_cache.find(key);
  if (it != c.rows_cache.end()) return *it->second;
  auto [ta, tb, N, lda, ldb, ldc, acc, bf16] = key;
  const Mds md =
      make_mds(ta, tb, DNNL_RUNTIME_DIM_VAL, N, DNNL_RUNTIME_DIM_VAL, lda, ldb, ldc, bf16);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md.a, md.b, md.c), make_attr(acc), c.engine);
  auto e = std::make_unique<RowsEntry>();
  e->prim = dnnl::matmul(pd);
  // A runtime-dims primitive books a scratchpad that does not depend on M and K (it could not
  // know them), so one buffer serves every call.
  size_t sbytes = pd.scratchpad_desc().get_size();
  e->scratch_buf.resize(static_cast<int64_t>(sbytes > 0 ? sbytes : 64));
  e->scratch = memory(pd.scratchpad_desc(), c.engine, e->scratch_buf.data());
  RowsEntry& ref = *e;
  c.rows_cache.emplace(key, std::move(e));
  ++g_cached;
  return ref;
}

}  // namespace

namespace {
// gemm_rows and gemm_rows_bf16 (A, B: fp32 or bf16 as `bf16` says).
void gemm_rows_any(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
                   int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                   bool bf16) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    return;
  }
  RowsEntry& e = lookup_rows(RowsKey{trans_a, trans_b, N, lda, ldb, ldc, accumulate, bf16});
  // At execution the memory objects carry the actual M and K (oneDNN requires fully defined
  // descriptors there); creating them wraps the user pointers and allocates nothing.
  const Mds md = make_mds(trans_a, trans_b, M, N, K, lda, ldb, ldc, bf16);
  const dnnl::engine& eng = ctx().engine;
  memory a(md.a, eng, const_cast<void*>(A)), b(md.b, eng, const_cast<void*>(B)), c(md.c, eng, C);
  e.prim.execute(ctx().stream, {{DNNL_ARG_SRC, a},
                                {DNNL_ARG_WEIGHTS, b},
                                {DNNL_ARG_DST, c},
                                {DNNL_ARG_SCRATCHPAD, e.scratch}});
  ctx().stream.wait();
}
}  // namespace

void gemm_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_rows_any(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, false);
}

namespace {

// Few rows of A against a transposed B (a linear layer's forward in generation's decode, one
// token per sequence): C[m, n] (+)= Σ_k A[m,k]·B[n,k] for M <= kGemvRows. Memory bound, so not
// oneDNN: each thread reads one contiguous block of B's rows once (the hardware prefetchers
// stream it) and keeps the M rows of A in cache. Each dot product sums exact fp32 products (bf16
// values widened) in 16 fp32 lanes in a fixed order: the result does not depend on threads.
constexpr int64_t kGemvRows = 4;

// 16 fp32 lanes as a GCC vector: one zmm register in the AVX-512 clone, two ymm in the AVX2 one.
// Written with vectors because the compiler vectorized the multi-row loops poorly (a 2-row bf16
// product ran at a third of the 1-row one's speed per row).
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
// (Out-parameters, not return values: a vector return changes the ABI between the clones.)
__attribute__((always_inline)) inline void load16(const float* p, v16f& v) {
  std::memcpy(&v, p, sizeof v);
}
__attribute__((always_inline)) inline void load16(const uint16_t* p, v16f& v) {  // bf16, widened
  v16h h;
  std::memcpy(&h, p, sizeof h);
  const v16u u = __builtin_convertvector(h, v16u) << 16;
  std::memcpy(&v, &u, sizeof v);
}
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

// out[m] = Σ_k a[m·lda + k]·b[k] for m < M: lane j of row m sums the products k ≡ j (mod 16) of
// the whole 16-blocks in order; then the tail, then the 16 lanes in order. Each row's result is
// the same whatever M.
template <int M, typename T>
__attribute__((always_inline)) inline void dot_rows_body(const float* a, int64_t lda, const T* b,
                                                         int64_t K, float* out) {
  v16f acc[M];
  for (int m = 0; m < M; ++m) acc[m] = v16f{};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f bk, am;
    load16(b + k, bk);
    for (int m = 0; m < M; ++m) {
      load16(a + m * lda + k, am);
      acc[m] += am * bk;
    }
  }
  for (int m = 0; m < M; ++m) {
    float s = 0.f;
    for (int64_t i = k; i < K; ++i) s += a[m * lda + i] * to_f32(b[i]);
    for (int j = 0; j < 16; ++j) s += acc[m][j];
    out[m] = s;
  }
}

// One CPU-dispatched function per row count and type (clang's target_clones takes no templates);
// each inlines the body above for its clone's instruction set.
#define TITAN_DOT_ROWS(M, T)                                                                       \
  TITAN_CLONES void dot_rows_##M(const float* a, int64_t lda, const T* b, int64_t K, float* out) { \
    dot_rows_body<M>(a, lda, b, K, out);                                                           \
  }
TITAN_DOT_ROWS(1, float)
TITAN_DOT_ROWS(2, float)
TITAN_DOT_ROWS(3, float)
TITAN_DOT_ROWS(4, float)
TITAN_DOT_ROWS(1, uint16_t)
TITAN_DOT_ROWS(2, uint16_t)
TITAN_DOT_ROWS(3, uint16_t)
TITAN_DOT_ROWS(4, uint16_t)
#undef TITAN_DOT_ROWS

// A (M ≤ 4 rows of activations) is used in fp32: bf16 rows are widened once per call (exact)
// into the calling thread's buffer, so the inner loop converts only B.
template <typename T>
void gemv(int64_t M, int64_t N, int64_t K, const T* A_in, int64_t lda_in, const T* B, int64_t ldb,
          float* C, int64_t ldc, bool accumulate) {
  const float* A;
  int64_t lda = lda_in;
  if constexpr (std::is_same_v<T, float>) {
    A = A_in;
  } else {
    Buffer<float>& wide = ctx().gemv_a;
    if (wide.size() < M * K) wide.resize(M * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) wide[m * K + k] = to_f32(A_in[m * lda_in + k]);
    A = wide.data(), lda = K;
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float r[kGemvRows];
    const T* b = B + n * ldb;
    switch (M) {
      case 1:
        dot_rows_1(A, lda, b, K, r);
        break;
      case 2:
        dot_rows_2(A, lda, b, K, r);
        break;
      case 3:
        dot_rows_3(A, lda, b, K, r);
        break;
      default:
        dot_rows_4(A, lda, b, K, r);
    }
    for (int64_t m = 0; m < M; ++m) C[m * ldc + n] = accumulate ? C[m * ldc + n] + r[m] : r[m];
  }
}

bool gemv_shape(bool trans_a, bool trans_b, int64_t M, int64_t K) {
  return !trans_a && trans_b && M <= kGemvRows && K > 0;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (gemv_shape(trans_a, trans_b, M, K)) return gemv(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  Entry& e = lookup(Key{trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, false});
  e.a.set_data_handle(const_cast<float*>(A));
  e.b.set_data_handle(const_cast<float*>(B));
  e.c.set_data_handle(C);
  e.prim.execute(ctx().stream, e.args);
  ctx().stream.wait();
}

namespace {
// bf16 rows×cols (row stride ld) -> compact fp32 rows×cols in buf (exact: bf16 ⊂ fp32).
const float* widen(Buffer<float>& buf, const uint16_t* X, int64_t rows, int64_t cols, int64_t ld) {
  if (buf.size() < rows * cols) buf.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) to_f32(DType::BF16, X + r * ld, cols, buf.data() + r * cols);
  return buf.data();
}
// widen, keeping the stored leading dimension (only the cols of each row written), so that the
// fp32 product's strides, and so gemm_rows' primitive key, do not change with M or K.
const float* widen_keep_ld(Buffer<float>& buf, const uint16_t* X, int64_t rows, int64_t cols,
                           int64_t ld) {
  if (buf.size() < (rows - 1) * ld + cols) buf.resize((rows - 1) * ld + cols);
  for (int64_t r = 0; r < rows; ++r) to_f32(DType::BF16, X + r * ld, cols, buf.data() + r * ld);
  return buf.data();
}
}  // namespace

bool bf16_gemm_native() {
  Context& c = ctx();
  if (c.bf16_native < 0) {
    // Probed once. Native: the (effective) ISA has bf16 instructions (AVX512-BF16 or AMX) and
    // oneDNN creates a bf16 matmul. On plain AVX512 oneDNN 2.6 emulates bf16 ("gemm:jit", measured
    // ~5x slower than its fp32 matmul here with ONEDNN_MAX_CPU_ISA=AVX512_CORE), on AVX2 it throws;
    // both take the converting path.
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    c.bf16_native = 0;
    if (isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx) {
      try {
        const auto pd = make_pd(Key{false, false, 64, 64, 64, 64, 64, 64, false, true});
        c.bf16_native = std::string(pd.impl_info_str()).rfind("ref", 0) == 0 ? 0 : 1;
      } catch (const dnnl::error&) {
        c.bf16_native = 0;
      }
    }
  }
  return c.bf16_native == 1;
}

void gemm_bf16_converting(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C,
                          int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    return;
  }
  Context& c = ctx();
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const float* a = widen(c.conv_a, A, a_rows, a_cols, lda);
  const float* b = widen(c.conv_b, B, b_rows, b_cols, ldb);
  gemm(trans_a, trans_b, M, N, K, a, a_cols, b, b_cols, C, ldc, accumulate);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
               bool accumulate) {
  if (M == 0 || N == 0) return;
  if (gemv_shape(trans_a, trans_b, M, K)) return gemv(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
  if (!bf16_gemm_native() || K == 0) {
    gemm_bf16_converting(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  Entry& e = lookup(Key{trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, true});
  e.a.set_data_handle(const_cast<uint16_t*>(A));
  e.b.set_data_handle(const_cast<uint16_t*>(B));
  e.c.set_data_handle(C);
  e.prim.execute(ctx().stream, e.args);
  ctx().stream.wait();
}

void gemm_rows_bf16_converting(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                               float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0)
    return gemm_rows(trans_a, trans_b, M, N, 0, nullptr, lda, nullptr, ldb, C, ldc, accumulate);
  Context& c = ctx();
  const float* a = widen_keep_ld(c.conv_a, A, trans_a ? K : M, trans_a ? M : K, lda);
  const float* b = widen_keep_ld(c.conv_b, B, trans_b ? N : K, trans_b ? K : N, ldb);
  gemm_rows(trans_a, trans_b, M, N, K, a, lda, b, ldb, C, ldc, accumulate);
}

void gemm_rows_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
                    bool accumulate) {
  if (!bf16_gemm_native()) {
    gemm_rows_bf16_converting(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  gemm_rows_any(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, true);
}

void linear_fwd_bf16(const float* x, const uint16_t* w, float* y, int64_t M, int64_t in,
                     int64_t out, uint16_t* scratch) {
  to_bf16(x, M * in, scratch);
  gemm_bf16(false, true, M, out, in, scratch, in, w, in, y, out, false);
}

void linear_bwd_bf16(const float* dy, const float* x, const uint16_t* w, float* dx, float* dw,
                     int64_t M, int64_t in, int64_t out, bool dx_accumulate, uint16_t* scratch) {
  uint16_t* dyb = scratch;
  to_bf16(dy, M * out, dyb);
  if (dx) gemm_bf16(false, false, M, in, out, dyb, out, w, in, dx, in, dx_accumulate);
  if (dw) {
    uint16_t* xb = scratch + M * out;
    to_bf16(x, M * in, xb);
    gemm_bf16(true, false, out, in, M, dyb, out, xb, in, dw, in, true);
  }
}

std::string gemm_isa(bool bf16) {
  if (bf16 && !bf16_gemm_native()) return "bf16->f32 convert + " + gemm_isa(false);
  const int64_t n = 2048;
  return make_pd(Key{false, false, n, n, n, n, n, n, false, bf16}).impl_info_str();
}

int64_t gemm_cache_size() { return g_cached.load(); }

}  // namespace titan::ops

#include "titan/core/cpu.h"
#include "titan/core/progress.h"

namespace titan::ops {
double gemm_probe_flops(int64_t n, int reps) {
  Buffer<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.1f;
    b[i] = static_cast<float>(i % 5) * 0.1f;
  }
  gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);  // warm-up
  double best = 1e30;
  Progress progress("measuring the fp32 GEMM rate", reps, false, "runs");
  for (int r = 0; r < reps; ++r, progress.add(1)) {
    double t0 = cpu::now_seconds();
    gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);
    best = std::min(best, cpu::now_seconds() - t0);
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

double gemm_probe_flops_bf16(int64_t n, int reps) {
  Buffer<float> af(n * n), bf(n * n);
  Buffer<uint16_t> a(n * n), b(n * n);
  Buffer<float> c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    af[i] = static_cast<float>(i % 7) * 0.1f;
    bf[i] = static_cast<float>(i % 5) * 0.1f;
  }
  f32_to(DType::BF16, af.data(), n * n, a.data());
  f32_to(DType::BF16, bf.data(), n * n, b.data());
  gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);  // warm-up
  double best = 1e30;
  Progress progress("measuring the bf16 GEMM rate", reps, false, "runs");
  for (int r = 0; r < reps; ++r, progress.add(1)) {
    double t0 = cpu::now_seconds();
    gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);
    best = std::min(best, cpu::now_seconds() - t0);
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}
}  // namespace titan::ops
