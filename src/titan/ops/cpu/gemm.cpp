#include "titan/ops/gemm.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "oneapi/dnnl/dnnl.hpp"
#include "titan/core/buffer.h"

namespace titan::ops {
namespace {

using dnnl::memory;
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

struct Entry {
  dnnl::matmul prim;
  memory a, b, c, scratch;
  Buffer<uint8_t> scratch_buf;
  std::unordered_map<int, memory> args;
};

// gemm_rows: M and K are runtime dimensions, so the key leaves them out.
using RowsKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, bool>;

struct RowsEntry {
  dnnl::matmul prim;
  memory scratch;
  Buffer<uint8_t> scratch_buf;
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::map<RowsKey, std::unique_ptr<RowsEntry>> rows_cache;
};

Context& ctx() {
  static Context c;
  return c;
}

Entry& lookup(const Key& key) {
  Context& c = ctx();
  auto it = c.cache.find(key);
  if (it != c.cache.end()) return *it->second;
  auto [ta, tb, M, N, K, lda, ldb, ldc, acc] = key;
  const auto f32 = memory::data_type::f32;
  // A logical [M,K]: stored [M,K] with row stride lda, or stored [K,M] (transposed) with row stride
  // lda.
  memory::desc a_md({M, K}, f32, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
  memory::desc b_md({K, N}, f32, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  memory::desc c_md({M, N}, f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, c.engine);
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
  return ref;
}

// Memory descriptors of A[M,K], B[K,N], C[M,N] (dims M or K may be DNNL_RUNTIME_DIM_VAL).
struct Mds {
  memory::desc a, b, c;
};
Mds make_mds(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
             int64_t ldc) {
  const auto f32 = memory::data_type::f32;
  return {memory::desc({M, K}, f32, ta ? memory::dims{1, lda} : memory::dims{lda, 1}),
          memory::desc({K, N}, f32, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1}),
          memory::desc({M, N}, f32, memory::dims{ldc, 1})};
}

RowsEntry& lookup_rows(const RowsKey& key) {
  Context& c = ctx();
  auto it = c.rows_cache.find(key);
  if (it != c.rows_cache.end()) return *it->second;
  auto [ta, tb, N, lda, ldb, ldc, acc] = key;
  const Mds md = make_mds(ta, tb, DNNL_RUNTIME_DIM_VAL, N, DNNL_RUNTIME_DIM_VAL, lda, ldb, ldc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md.a, md.b, md.c), attr, c.engine);
  auto e = std::make_unique<RowsEntry>();
  e->prim = dnnl::matmul(pd);
  // A runtime-dims primitive books a scratchpad that does not depend on M and K (it could not
  // know them), so one buffer serves every call.
  size_t sbytes = pd.scratchpad_desc().get_size();
  e->scratch_buf.resize(static_cast<int64_t>(sbytes > 0 ? sbytes : 64));
  e->scratch = memory(pd.scratchpad_desc(), c.engine, e->scratch_buf.data());
  RowsEntry& ref = *e;
  c.rows_cache.emplace(key, std::move(e));
  return ref;
}

}  // namespace

void gemm_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    return;
  }
  RowsEntry& e = lookup_rows(RowsKey{trans_a, trans_b, N, lda, ldb, ldc, accumulate});
  // At execution the memory objects carry the actual M and K (oneDNN requires fully defined
  // descriptors there); creating them wraps the user pointers and allocates nothing.
  const Mds md = make_mds(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  const dnnl::engine& eng = ctx().engine;
  memory a(md.a, eng, const_cast<float*>(A)), b(md.b, eng, const_cast<float*>(B)), c(md.c, eng, C);
  e.prim.execute(ctx().stream, {{DNNL_ARG_SRC, a},
                                {DNNL_ARG_WEIGHTS, b},
                                {DNNL_ARG_DST, c},
                                {DNNL_ARG_SCRATCHPAD, e.scratch}});
  ctx().stream.wait();
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  Entry& e = lookup(Key{trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate});
  e.a.set_data_handle(const_cast<float*>(A));
  e.b.set_data_handle(const_cast<float*>(B));
  e.c.set_data_handle(C);
  e.prim.execute(ctx().stream, e.args);
  ctx().stream.wait();
}

int64_t gemm_cache_size() {
  return static_cast<int64_t>(ctx().cache.size() + ctx().rows_cache.size());
}

}  // namespace titan::ops

#include "titan/core/cpu.h"

namespace titan::ops {
double gemm_probe_flops(int64_t n, int reps) {
  Buffer<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.1f;
    b[i] = static_cast<float>(i % 5) * 0.1f;
  }
  gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = cpu::now_seconds();
    gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);
    best = std::min(best, cpu::now_seconds() - t0);
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}
}  // namespace titan::ops
