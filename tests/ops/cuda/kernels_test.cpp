// Every CUDA op (ops/cuda/cuda_ops.h, optim/cuda/adamw.h) against the CPU op of the same name on
// the same inputs (ggml's test-backend-ops idea), forward and backward, at odd shapes (rows and
// columns that fill no tile, strided rows, repeated token ids, transposed and accumulating GEMMs).
// GEMMs are checked against a double-precision product (the oneDNN GEMM is not built into this
// program, which must build where only the CUDA toolkit is). Tolerances, as max |gpu − reference| /
// max |reference| unless said:
//   exact (0): reserved memory (zeros where given back, values kept elsewhere),
//     embedding fwd/bwd, rope (and its table), add, scale, copy_rows, sum_rows, dropout (the same
//     counter-based masks), to_bf16, from_bf16, clip, rmsnorm_bwd's dw (same products, same
//     summation order, no FMA contraction on either side);
//   2e-6: rmsnorm_fwd y, rstd and rmsnorm_bwd dx (the sum of squares reduced in another order);
//   2e-6: swiglu (CUDA's expf against the CPU's polynomial exp, each within ~2 ulp);
//   2e-6: adamw_step (the CPU build may contract into FMAs; 1 ulp of p);
//   1e-12: sum_squares (double sums in another order);
//   1e-5: attention fwd/bwd (o, dq, dk, dv; lse absolute), tiles of 32 with an online softmax and
//     CUDA's expf against the CPU's tiles and polynomial exp: the sums run in other orders;
//     attention_cached the same (an online softmax against the CPU's two passes);
//   3e-2: the bf16 attention against the fp32 CPU attention (q, k, v, dout, P and dS rounded to
//     bf16: 2^-9 relative each, over sums of up to S terms);
//   1e-5: lm_head_ce's loss, dh and dw against a double-precision reference (fp32 logits);
//     1e-2 for lm_head_ce_bf16 (h and the logit gradient rounded to bf16 for the GEMMs);
//   router: the selected experts and counts exact; p, w and psum 2e-6 (CUDA's expf against
//     glibc's), dlogits 1e-5; the expert bias update exact;
//   grouped experts: 1e-5 (fp32) / 2e-2 (bf16) against the expert MLPs in double, y, dx, dw and
//     the weight gradients, an expert with no tokens included;
//   gemm: |Δ| <= 1e-5 · Σ_k |a_ik·b_kj| per element (fp32 sums of K products; bf16 inputs are
//     exact in fp32, so the same bound holds for gemm_bf16).
// Exit 0: all passed; 1: a check failed; 77: no GPU visible (ctest reports it skipped).
// --probe: also measures cuBLASLt's bf16 and fp32 GEMM rate at 8192³ (TFLOP/s).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/error.h"
#include "titan/ops/attention.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/loss.h"
#include "titan/ops/router.h"
#include "titan/optim/adamw.h"
#include "titan/optim/cuda/adamw.h"

namespace cu = titan::ops::cuda;
namespace ops = titan::ops;

namespace {

int failures = 0;

void report(const std::string& name, double err, double tol) {
  const bool ok = err <= tol;
  if (!ok) ++failures;
  std::printf("%-4s %-44s %.3g (tolerance %.3g)\n", ok ? "ok" : "FAIL", name.c_str(), err, tol);
}

std::mt19937 rng(1234);
std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A device copy of a host vector, freed at scope end.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    p = static_cast<T*>(cu::alloc(n * sizeof(T)));
    cu::copy(p, h.data(), n * sizeof(T));
  }
  explicit Dev(size_t count) : n(count) {
    p = static_cast<T*>(cu::alloc(n * sizeof(T)));
    cu::memset(p, 0, n * sizeof(T));
  }
  ~Dev() { cu::free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    cu::copy(h.data(), p, n * sizeof(T));
    return h;
  }
};

double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(got[i]) - want[i]));
    m = std::max(m, std::fabs(static_cast<double>(want[i])));
  }
  return m > 0 ? d / m : d;
}

void test_embedding() {
  const int64_t T = 1000, V = 301, D = 129;
  std::vector<int32_t> ids(T);
  std::uniform_int_distribution<int32_t> pick(0, 40);  // many repeats
  for (auto& i : ids) i = pick(rng) * 7 % static_cast<int32_t>(V);
  const auto table = randn(V * D), dout = randn(T * D);
  std::vector<float> out(T * D), dtable = randn(V * D);
  Dev<int32_t> d_ids(ids);
  Dev<float> d_table(table), d_out(T * D), d_dout(dout), d_dtable(dtable);
  ops::embedding_fwd(ids.data(), T, table.data(), V, D, out.data());
  cu::embedding_fwd(d_ids.p, T, d_table.p, V, D, d_out.p);
  report("embedding_fwd", rel_diff(d_out.host(), out), 0);
  ops::embedding_bwd(ids.data(), T, dout.data(), D, dtable.data());
  cu::embedding_bwd(d_ids.p, T, d_dout.p, D, d_dtable.p);
  report("embedding_bwd (sums in token order)", rel_diff(d_dtable.host(), dtable), 0);
  // Tensor parallelism's vocabulary shard: rows [100, 220) of the table.
  const int64_t v0 = 100, vl = 120;
  ops::embedding_fwd_range(ids.data(), T, table.data() + v0 * D, V, v0, vl, D, out.data());
  cu::embedding_fwd_range(d_ids.p, T, d_table.p + v0 * D, V, v0, vl, D, d_out.p);
  report("embedding_fwd_range", rel_diff(d_out.host(), out), 0);
  ops::embedding_bwd_range(ids.data(), T, dout.data(), v0, vl, D, dtable.data() + v0 * D);
  cu::embedding_bwd_range(d_ids.p, T, d_dout.p, v0, vl, D, d_dtable.p + v0 * D);
  report("embedding_bwd_range", rel_diff(d_dtable.host(), dtable), 0);
  std::vector<int32_t> bad = ids;
  bad[17] = static_cast<int32_t>(V);
  Dev<int32_t> d_bad(bad);
  std::string msg;
  try {
    cu::embedding_fwd(d_bad.p, T, d_table.p, V, D, d_out.p);
  } catch (const titan::Error& e) {
    msg = e.what();
  }
  report("embedding_fwd names a bad id's position", msg.find("at position 17") == std::string::npos,
         0);
}

void test_rmsnorm() {
  for (const ops::NormRows s :
       {ops::NormRows{33, 1, 100, 107, 105}, ops::NormRows{19, 3, 128, 400, 390},
        ops::NormRows{1, 1, 4096, 4096, 4096}}) {
    const std::string at =
        " T" + std::to_string(s.T) + " H" + std::to_string(s.H) + " N" + std::to_string(s.N);
    const auto x = randn(s.T * s.ldx), w = randn(s.N, 0.3f), dy = randn(s.T * s.ldy);
    std::vector<float> y(s.T * s.ldy, 0.0f), rstd(s.T * s.H), dx(s.T * s.ldx, 0.0f),
        dw = randn(s.N), scratch(ops::rmsnorm_bwd_scratch(s));
    Dev<float> d_x(x), d_w(w), d_y(y), d_rstd(rstd.size()), d_dy(dy), d_dx(dx), d_dw(dw),
        d_scratch(scratch.size());
    ops::rmsnorm_fwd(s, x.data(), w.data(), 1e-6f, y.data(), rstd.data());
    cu::rmsnorm_fwd(s, d_x.p, d_w.p, 1e-6f, d_y.p, d_rstd.p);
    report("rmsnorm_fwd y" + at, rel_diff(d_y.host(), y), 2e-6);
    report("rmsnorm_fwd rstd" + at, rel_diff(d_rstd.host(), rstd), 2e-6);
    // The backward from the same rstd on both sides.
    cu::copy(d_rstd.p, rstd.data(), rstd.size() * sizeof(float));
    ops::rmsnorm_bwd(s, dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(),
                     scratch.data());
    cu::rmsnorm_bwd(s, d_dy.p, d_x.p, d_w.p, d_rstd.p, d_dx.p, d_dw.p, d_scratch.p);
    report("rmsnorm_bwd dx" + at, rel_diff(d_dx.host(), dx), 2e-6);
    report("rmsnorm_bwd dw (32 row blocks)" + at, rel_diff(d_dw.host(), dw), 0);
  }
}

void test_rope_swiglu_add() {
  const int64_t T = 19, H = 5, d = 64, ldx = H * d + 3, max_pos = 50;
  std::vector<float> cs(max_pos * d);
  ops::rope_table(max_pos, d, 1e6, cs.data());
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 13) % max_pos);
  auto x = randn(T * ldx);
  Dev<float> d_x(x), d_cs(cs);
  Dev<int32_t> d_pos(pos);
  ops::rope_fwd(x.data(), T, H, d, ldx, pos.data(), cs.data());
  cu::rope_fwd(d_x.p, T, H, d, ldx, d_pos.p, d_cs.p);
  report("rope_fwd", rel_diff(d_x.host(), x), 0);
  ops::rope_bwd(x.data(), T, H, d, ldx, pos.data(), cs.data());
  cu::rope_bwd(d_x.p, T, H, d, ldx, d_pos.p, d_cs.p);
  report("rope_bwd", rel_diff(d_x.host(), x), 0);
  // The table at Qwen3's size (θ 1e6, head_dim 128, 40960 positions), where an ulp of the inverse
  // frequency grows into the angle's thousandths: the same bits as the CPU's.
  const int64_t big_pos = 40960, big_d = 128;
  std::vector<float> big(big_pos * big_d);
  ops::rope_table(big_pos, big_d, 1e6, big.data());
  Dev<float> d_big(big.size());
  cu::rope_table(big_pos, big_d, 1e6, d_big.p);
  report("rope_table (40960 positions, d 128)", rel_diff(d_big.host(), big), 0);

  const int64_t S = 31, F = 97;
  const auto ab = randn(S * 2 * F, 3.0f), dg = randn(S * F);
  std::vector<float> g(S * F), dab(S * 2 * F);
  Dev<float> d_ab(ab), d_g(g.size()), d_dg(dg), d_dab(dab.size());
  ops::swiglu_fwd(ab.data(), g.data(), S, F);
  cu::swiglu_fwd(d_ab.p, d_g.p, S, F);
  report("swiglu_fwd", rel_diff(d_g.host(), g), 2e-6);
  ops::swiglu_bwd(dg.data(), ab.data(), dab.data(), S, F);
  cu::swiglu_bwd(d_dg.p, d_ab.p, d_dab.p, S, F);
  report("swiglu_bwd", rel_diff(d_dab.host(), dab), 2e-6);

  const int64_t n = 100003;
  auto a = randn(n), b = randn(n);
  std::vector<float> sum(n);
  Dev<float> d_a(a), d_b(b), d_sum(n);
  ops::add(a.data(), b.data(), sum.data(), n);
  cu::add(d_a.p, d_b.p, d_sum.p, n);
  report("add", rel_diff(d_sum.host(), sum), 0);
  ops::add_inplace(a.data(), b.data(), n);
  cu::add_inplace(d_a.p, d_b.p, n);
  report("add_inplace", rel_diff(d_a.host(), a), 0);
  ops::scale_inplace(a.data(), n, 0.37f);
  cu::scale_inplace(d_a.p, n, 0.37f);
  report("scale_inplace", rel_diff(d_a.host(), a), 0);
  {  // expert parallelism's row moves: rows of 5 at strides 7 and 6, a permutation of 3000 rows
    const int64_t rows = 3000, w = 5, k = 3;
    std::vector<int32_t> perm(rows);
    for (int64_t i = 0; i < rows; ++i) perm[i] = static_cast<int32_t>((i * 17) % rows);
    Dev<int32_t> d_perm(perm);
    std::vector<float> moved(rows * 6, 0.0f), summed(rows / k * w);
    Dev<float> d_moved(moved), d_summed(rows / k * w);
    ops::copy_rows(a.data(), 7, perm.data(), moved.data(), 6, nullptr, rows, w);
    cu::copy_rows(d_a.p, 7, d_perm.p, d_moved.p, 6, nullptr, rows, w);
    report("copy_rows (source indexed)", rel_diff(d_moved.host(), moved), 0);
    ops::copy_rows(a.data(), 7, nullptr, moved.data(), 6, perm.data(), rows, w);
    cu::copy_rows(d_a.p, 7, nullptr, d_moved.p, 6, d_perm.p, rows, w);
    report("copy_rows (destination indexed)", rel_diff(d_moved.host(), moved), 0);
    ops::sum_rows(a.data(), 7, perm.data(), k, summed.data(), rows / k, w);
    cu::sum_rows(d_a.p, 7, d_perm.p, k, d_summed.p, rows / k, w);
    report("sum_rows", rel_diff(d_summed.host(), summed), 0);
  }
  std::vector<float> dropped(n);  // LoRA's dropout: the same counter-based masks
  Dev<float> d_dropped(n);
  ops::dropout(a.data(), dropped.data(), n, 42, (3ull << 20) + 5, 0.1);
  cu::dropout(d_a.p, d_dropped.p, n, 42, (3ull << 20) + 5, 0.1);
  report("dropout", rel_diff(d_dropped.host(), dropped), 0);
  ops::dropout_add(b.data(), a.data(), n, 42, (3ull << 20) + 5, 0.1);
  cu::dropout_add(d_b.p, d_a.p, n, 42, (3ull << 20) + 5, 0.1);
  report("dropout_add", rel_diff(d_a.host(), a), 0);
  a[5] = NAN;
  a[6] = INFINITY;
  a[7] = -0.0f;
  cu::copy(d_a.p, a.data(), n * sizeof(float));
  std::vector<uint16_t> h16(n);
  Dev<uint16_t> d16(n);
  ops::to_bf16(a.data(), n, h16.data());
  cu::to_bf16(d_a.p, n, d16.p);
  report("to_bf16 (NaN, inf, -0 included)", d16.host() != h16, 0);
  std::vector<float> wide(n);
  ops::from_bf16(h16.data(), n, wide.data());
  cu::from_bf16(d16.p, n, d_a.p);
  const std::vector<float> dwide = d_a.host();
  report("from_bf16 (NaN, inf, -0 included)", std::memcmp(dwide.data(), wide.data(), 4 * n) != 0,
         0);
}

// reserve/commit/decommit (core/device.h; FSDP's flat buffers): what a range given back reads
// once committed again (zeros), what the partly covered granule at its end keeps (its values),
// and that the device's memory in use falls when whole granules are given back. Stated for any
// granule size up to 2 MiB (the offsets below are multiples of it).
void test_reserved_memory() {
  constexpr size_t M = size_t{1} << 20, total = 64 * M;
  char* p = static_cast<char*>(cu::reserve(total + 100));
  std::vector<float> pattern(M / 4);  // 1 MiB of floats
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<float>(i) + 0.5f;
  cu::commit(p + M, 2 * M);  // [1, 3) MiB
  cu::copy(p + M, pattern.data(), M);
  cu::copy(p + 2 * M, pattern.data(), M);
  cu::decommit(p, 2 * M + 4);  // [0, 2 MiB + 4): the granule at 2 MiB only in part
  cu::commit(p, 3 * M);
  std::vector<float> back(3 * M / 4);
  cu::copy(back.data(), p, 3 * M);
  bool zeros = true, kept = true;
  for (size_t i = 0; i < (2 * M + 4) / 4; ++i) zeros = zeros && back[i] == 0.0f;
  for (size_t i = (2 * M + 4) / 4; i < back.size(); ++i)
    kept = kept && back[i] == pattern[i - 2 * M / 4];
  report("decommit: the range reads zero once committed", !zeros, 0);
  report("decommit: a granule covered in part keeps the rest", !kept, 0);
  // The unmap waits for the kernels queued before: with the stream held up (a host function
  // sleeping 300 ms), a kernel on the range queued, then the range given back, taken back before
  // the kernel ran, written by a second kernel, given back again, and the stream let go: no fault
  // (the kernels ran on mapped memory), and the range read back after a last commit is zeros.
  cu::commit(p + 8 * M, 4 * M);
  cu::copy(p + 8 * M, pattern.data(), M);
  auto hold_up = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  if (cudaLaunchHostFunc(cudaStreamLegacy, hold_up, nullptr) != cudaSuccess)
    throw titan::Error("cudaLaunchHostFunc failed");
  auto* f = reinterpret_cast<float*>(p + 8 * M);
  cu::scale_inplace(f, static_cast<int64_t>(M), 2.0f);  // queued behind the sleep
  cu::decommit(p + 8 * M, 4 * M);                       // retiring, not unmapped
  cu::commit(p + 8 * M, 4 * M);                         // taken back (zeroed in stream order)
  cu::scale_inplace(f, static_cast<int64_t>(M), 3.0f);
  cu::decommit(p + 8 * M, 4 * M);
  cu::synchronize();
  cu::commit(p + 8 * M, 4 * M);
  cu::copy(back.data(), p + 8 * M, M);
  bool again = true;
  for (size_t i = 0; i < M / 4; ++i) again = again && back[i] == 0.0f;
  report("kernels queued before a decommit run on mapped memory; zeros", !again, 0);
  int64_t all = 0, used_full = 0, used_back = 0;
  cu::commit(p, total + 100);
  cu::memory_info(&all, &used_full);
  cu::decommit(p, total + 100);
  cu::synchronize();
  cu::commit(p, 4);  // unmaps what retired (and maps the first granule again)
  cu::memory_info(&all, &used_back);
  report("decommit gives back at least 60 of 64 MiB", used_full - used_back < int64_t{60} << 20, 0);
  cu::decommit(p, 2 * M);
  cu::commit(p + 5 * M, 4);
  cu::free(p);  // with granules mapped and retiring
}

// Columns [c0, c0 + n) of every row of a [rows, ld] matrix.
std::vector<float> cols(const std::vector<float>& m, int64_t rows, int64_t ld, int64_t c0,
                        int64_t n) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), m.begin() + r * ld + c0, m.begin() + r * ld + c0 + n);
  return out;
}

// q, k, v as the model passes them: views into one fused [T, (Hq + 2·Hkv)·d] projection output.
void test_attention() {
  struct Case {
    int64_t B, S, Hq, Hkv, d;
    bool block_causal;
  };
  // head_dim 64 and 128: the bf16 attention on tensor cores (tiles of 64: 77, 130 and 200 tokens
  // leave partial tiles, block-causal segments cross them; 50 is one partial tile, 128 two whole
  // ones); 16 and 256: on CUDA cores.
  for (const Case c :
       {Case{2, 77, 4, 2, 64, true}, Case{1, 130, 8, 1, 128, false}, Case{1, 200, 4, 2, 128, true},
        Case{1, 50, 4, 4, 64, true}, Case{2, 128, 4, 1, 128, true}, Case{1, 33, 2, 2, 16, true},
        Case{1, 40, 2, 1, 256, false}}) {
    char at[96];
    std::snprintf(at, sizeof at, " B%lld S%lld Hq%lld Hkv%lld d%lld%s", static_cast<long long>(c.B),
                  static_cast<long long>(c.S), static_cast<long long>(c.Hq),
                  static_cast<long long>(c.Hkv), static_cast<long long>(c.d),
                  c.block_causal ? " block-causal" : "");
    const int64_t T = c.B * c.S, Q = c.Hq * c.d, KV = c.Hkv * c.d, ld = Q + 2 * KV;
    const ops::AttnShape s{c.B, c.S, c.Hq, c.Hkv, c.d, 1.0f / std::sqrt(static_cast<float>(c.d)),
                           ld,  ld,  ld};
    std::vector<int32_t> pos(T), seg(T);
    for (int64_t t = 0; t < T; ++t)  // documents of 29 tokens, restarting in each row
      pos[t] = static_cast<int32_t>((t % c.S) % 29);
    ops::attention_segments(pos.data(), c.B, c.S, c.block_causal, seg.data());
    Dev<int32_t> d_pos(pos), d_seg(T);
    cu::attention_segments(d_pos.p, c.B, c.S, c.block_causal, d_seg.p);
    report(std::string("attention_segments") + at, d_seg.host() != seg, 0);

    const auto qkv = randn(T * ld), dout = randn(T * Q);
    std::vector<float> o(T * Q), lse(c.B * c.Hq * c.S), ws(ops::attention_workspace(s)), dq(T * Q),
        dqkv(T * ld, 0.0f), delta(lse.size());  // dq [T, Hq·d]; dk, dv in dqkv
    ops::attention_fwd(s, qkv.data(), qkv.data() + Q, qkv.data() + Q + KV, seg.data(), o.data(),
                       lse.data(), ws.data());
    ops::attention_bwd(s, qkv.data(), qkv.data() + Q, qkv.data() + Q + KV, o.data(), lse.data(),
                       dout.data(), seg.data(), dq.data(), dqkv.data() + Q, dqkv.data() + Q + KV,
                       delta.data(), ws.data());
    for (const bool bf16 : {false, true}) {
      const std::string name = std::string(bf16 ? "attention_bf16" : "attention") + at;
      const double tol = bf16 ? 3e-2 : 1e-5;
      Dev<float> d_qkv(qkv), d_o(o.size()), d_lse(lse.size()), d_dout(dout), d_dqkv(T * ld),
          d_dq(T * Q), d_delta(lse.size());
      (bf16 ? cu::attention_fwd_bf16 : cu::attention_fwd)(s, d_qkv.p, d_qkv.p + Q, d_qkv.p + Q + KV,
                                                          d_seg.p, d_o.p, d_lse.p, nullptr);
      report(name + " o", rel_diff(d_o.host(), o), tol);
      double dl = 0;
      const auto got_lse = d_lse.host();
      for (size_t i = 0; i < lse.size(); ++i)
        dl = std::max(dl, std::fabs(static_cast<double>(got_lse[i]) - lse[i]));
      report(name + " lse (absolute)", dl, bf16 ? tol : 1e-5);
      // The backward from the CPU's o and lse, so that it is checked alone.
      cu::copy(d_o.p, o.data(), o.size() * sizeof(float));
      cu::copy(d_lse.p, lse.data(), lse.size() * sizeof(float));
      (bf16 ? cu::attention_bwd_bf16 : cu::attention_bwd)(
          s, d_qkv.p, d_qkv.p + Q, d_qkv.p + Q + KV, d_o.p, d_lse.p, d_dout.p, d_seg.p, d_dq.p,
          d_dqkv.p + Q, d_dqkv.p + Q + KV, d_delta.p, nullptr);
      const auto got = d_dqkv.host();
      report(name + " dq", rel_diff(d_dq.host(), dq), tol);
      report(name + " dk", rel_diff(cols(got, T, ld, Q, KV), cols(dqkv, T, ld, Q, KV)), tol);
      report(name + " dv", rel_diff(cols(got, T, ld, Q + KV, KV), cols(dqkv, T, ld, Q + KV, KV)),
             tol);
    }
  }
}

// Generation's attention against a cache: 5 new tokens of two sequences (cached 300 and 150
// rows; the tokens see 298, 299, 300, then 1 and 150 keys: chunks of 128 keys, a partial one and
// a single key), GQA 4:1, head_dim 64 and 128. The online softmax sums in another order than the
// CPU's two passes: 1e-5.
void test_attention_cached() {
  const int64_t T = 5, Hq = 8, Hkv = 2;
  const std::vector<int32_t> n_keys = {298, 299, 300, 1, 150};
  for (const int64_t d : {int64_t{64}, int64_t{128}}) {
    const int64_t ldq = Hq * d + 5, ldkv = Hkv * d;
    const auto q = randn(T * ldq), k0 = randn(300 * ldkv), v0 = randn(300 * ldkv),
               k1 = randn(150 * ldkv), v1 = randn(150 * ldkv);
    std::vector<float> o(T * Hq * d);
    std::vector<const float*> kp = {k0.data(), k0.data(), k0.data(), k1.data(), k1.data()};
    std::vector<const float*> vp = {v0.data(), v0.data(), v0.data(), v1.data(), v1.data()};
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    ops::attention_cached(q.data(), ldq, kp.data(), vp.data(), n_keys.data(), ldkv, T, Hq, Hkv, d,
                          scale, o.data());
    Dev<float> d_q(q), d_k0(k0), d_v0(v0), d_k1(k1), d_v1(v1), d_o(o.size());
    Dev<int32_t> d_n(n_keys);
    Dev<const float*> d_kp(std::vector<const float*>{d_k0.p, d_k0.p, d_k0.p, d_k1.p, d_k1.p});
    Dev<const float*> d_vp(std::vector<const float*>{d_v0.p, d_v0.p, d_v0.p, d_v1.p, d_v1.p});
    cu::attention_cached(d_q.p, ldq, d_kp.p, d_vp.p, d_n.p, ldkv, T, Hq, Hkv, d, scale, d_o.p);
    report("attention_cached d" + std::to_string(d), rel_diff(d_o.host(), o), 1e-5);
  }
}

// lm_head + CE in chunks of 32 rows (the last one short), some labels ignored, against the loss
// and gradients computed in double from their definition.
void test_lm_head_ce() {
  const int64_t T = 70, D = 48, V = 333, chunk = 32;
  const auto h = randn(T * D), w = randn(V * D, 0.2f), dw0 = randn(V * D, 0.01f);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t)
    labels[t] = t % 9 == 4 ? ops::kIgnoreIndex : static_cast<int32_t>((t * 37) % V);
  int64_t valid = 0;
  for (int32_t l : labels) valid += l != ops::kIgnoreIndex;
  const float scale = 1.0f / static_cast<float>(valid);
  double loss = 0;
  std::vector<double> dh(T * D, 0.0), dw(dw0.begin(), dw0.end()), z(V);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == ops::kIgnoreIndex) continue;
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < V; ++j) {
      z[j] = 0;
      for (int64_t c = 0; c < D; ++c) z[j] += static_cast<double>(h[t * D + c]) * w[j * D + c];
      mx = std::max(mx, z[j]);
    }
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    const double lse = mx + std::log(sum);
    loss += lse - z[labels[t]];
    for (int64_t j = 0; j < V; ++j) {
      const double g = scale * (std::exp(z[j] - lse) - (j == labels[t] ? 1.0 : 0.0));
      for (int64_t c = 0; c < D; ++c) {
        dh[t * D + c] += g * w[j * D + c];
        dw[j * D + c] += g * h[t * D + c];
      }
    }
  }
  const std::vector<float> dh_ref(dh.begin(), dh.end()), dw_ref(dw.begin(), dw.end());
  std::vector<uint16_t> w16(w.size());
  ops::to_bf16(w.data(), V * D, w16.data());
  for (const bool bf16 : {false, true}) {
    const std::string name = bf16 ? "lm_head_ce_bf16" : "lm_head_ce";
    const double tol = bf16 ? 1e-2 : 1e-5;
    Dev<float> d_h(h), d_w(w), d_dh(T * D), d_dw(dw0),
        d_scratch(bf16 ? ops::lm_head_ce_bf16_scratch(T, V, D, chunk)
                       : ops::lm_head_ce_scratch(T, V, chunk));
    Dev<uint16_t> d_w16(w16);
    Dev<int32_t> d_labels(labels);
    const ops::LossSum r = bf16 ? cu::lm_head_ce_bf16(d_h.p, d_w16.p, d_labels.p, T, D, V, chunk,
                                                      scale, d_dh.p, d_dw.p, d_scratch.p)
                                : cu::lm_head_ce(d_h.p, d_w.p, d_labels.p, T, D, V, chunk, scale,
                                                 d_dh.p, d_dw.p, d_scratch.p);
    report(name + " valid count", r.count != valid, 0);
    report(name + " loss", std::fabs(r.sum - loss) / loss, tol);
    report(name + " dh", rel_diff(d_dh.host(), dh_ref), tol);
    report(name + " dw +=", rel_diff(d_dw.host(), dw_ref), tol);
    // The vocabulary-parallel form on one rank (the whole vocabulary; the group's reductions are
    // the identity): the same loss and gradients.
    struct One final : ops::RankReducer {
      void sum(float*, int64_t) override {}
      void max(float*, int64_t) override {}
    } one;
    Dev<float> d_dh2(T * D), d_dw2(dw0),
        d_scratch2(ops::lm_head_ce_vocab_parallel_scratch(T, V, D, chunk, bf16));
    const ops::LossSum p =
        cu::lm_head_ce_vocab_parallel(d_h.p, d_w.p, bf16 ? d_w16.p : nullptr, d_labels.p, T, D, V,
                                      0, V, chunk, scale, d_dh2.p, d_dw2.p, d_scratch2.p, one);
    report(name + " vocab-parallel (1 rank) valid count", p.count != valid, 0);
    report(name + " vocab-parallel (1 rank) loss", std::fabs(p.sum - loss) / loss, tol);
    report(name + " vocab-parallel (1 rank) dh", rel_diff(d_dh2.host(), dh_ref), tol);
    report(name + " vocab-parallel (1 rank) dw +=", rel_diff(d_dw2.host(), dw_ref), tol);
  }
  std::vector<int32_t> bad = labels;
  bad[11] = static_cast<int32_t>(V);
  Dev<int32_t> d_bad(bad);
  Dev<float> d_h(h), d_w(w), d_scratch(ops::lm_head_ce_scratch(T, V, chunk));
  std::string msg;
  try {
    cu::lm_head_ce(d_h.p, d_w.p, d_bad.p, T, D, V, chunk, 0.0f, nullptr, nullptr, d_scratch.p);
  } catch (const titan::Error& e) {
    msg = e.what();
  }
  report("lm_head_ce names a bad label's position", msg.find("at position 11") == std::string::npos,
         0);
}

void test_router() {
  struct Case {
    int64_t T, E, K;
    bool norm, bias;
  };
  for (const Case c :
       {Case{300, 64, 4, true, true}, Case{77, 8, 2, false, false}, Case{5, 128, 8, true, false}}) {
    char at[64];
    std::snprintf(at, sizeof at, " T%lld E%lld K%lld%s%s", static_cast<long long>(c.T),
                  static_cast<long long>(c.E), static_cast<long long>(c.K), c.norm ? " norm" : "",
                  c.bias ? " bias" : "");
    const auto logits = randn(c.T * c.E, 2.0f), bias = randn(c.E, 0.1f), dw = randn(c.T * c.K),
               extra = randn(c.E, 0.01f);
    std::vector<float> p(c.T * c.E), w(c.T * c.K), dl(c.T * c.E);
    std::vector<int32_t> idx(c.T * c.K), top(c.T * c.K);
    ops::router_fwd(logits.data(), c.bias ? bias.data() : nullptr, c.T, c.E, c.K, c.norm, p.data(),
                    idx.data(), w.data());
    Dev<float> d_logits(logits), d_bias(bias), d_p(p.size()), d_w(w.size()), d_dw(dw),
        d_extra(extra), d_dl(dl.size());
    Dev<int32_t> d_idx(idx.size()), d_top(top.size());
    cu::router_fwd(d_logits.p, c.bias ? d_bias.p : nullptr, c.T, c.E, c.K, c.norm, d_p.p, d_idx.p,
                   d_w.p);
    report(std::string("router_fwd p") + at, rel_diff(d_p.host(), p), 2e-6);
    report(std::string("router_fwd experts") + at, d_idx.host() != idx, 0);
    report(std::string("router_fwd w") + at, rel_diff(d_w.host(), w), 2e-6);
    // The backward and statistics from the CPU's p, idx and w on both sides.
    cu::copy(d_p.p, p.data(), p.size() * sizeof(float));
    cu::copy(d_idx.p, idx.data(), idx.size() * sizeof(int32_t));
    cu::copy(d_w.p, w.data(), w.size() * sizeof(float));
    ops::router_bwd(p.data(), idx.data(), w.data(), dw.data(), extra.data(), c.T, c.E, c.K, c.norm,
                    dl.data());
    cu::router_bwd(d_p.p, d_idx.p, d_w.p, d_dw.p, d_extra.p, c.T, c.E, c.K, c.norm, d_dl.p);
    report(std::string("router_bwd") + at, rel_diff(d_dl.host(), dl), 1e-5);
    ops::topk_rows(p.data(), c.T, c.E, c.K, top.data());
    cu::topk_rows(d_p.p, c.T, c.E, c.K, d_top.p);
    report(std::string("topk_rows") + at, d_top.host() != top, 0);
    std::vector<double> hits(c.E, 3.0), psum(c.E, 0.5), load(c.E);
    Dev<double> d_hits(hits), d_psum(psum);
    ops::router_aux_stats(p.data(), idx.data(), c.T, c.E, c.K, hits.data(), psum.data());
    cu::router_aux_stats(d_p.p, d_idx.p, c.T, c.E, c.K, d_hits.p, d_psum.p);
    report(std::string("router_aux_stats hits") + at, d_hits.host() != hits, 0);
    const auto got_psum = d_psum.host();
    double dp = 0;
    for (int64_t e = 0; e < c.E; ++e) dp = std::max(dp, std::fabs(got_psum[e] - psum[e]) / psum[e]);
    report(std::string("router_aux_stats psum") + at, dp, 2e-6);
    for (int64_t e = 0; e < c.E; ++e) load[e] = static_cast<double>((e * 7) % 5);
    std::vector<float> eb = bias;
    Dev<double> d_load(load);
    Dev<float> d_eb(eb);
    ops::expert_bias_update(load.data(), c.E, 1e-3, eb.data());
    cu::expert_bias_update(d_load.p, c.E, 1e-3, d_eb.p);
    report(std::string("expert_bias_update") + at, rel_diff(d_eb.host(), eb), 0);
  }
}

// T = 50 sorts 100 pairs in one chunk of the routing kernel, T = 300 in three (ranks carried
// across chunks); K = 1 is expert parallelism's local op; an expert index outside [0, E) is
// refused naming its token and slot.
void test_experts(int64_t tokens, int64_t top_k) {
  const ops::ExpertsShape sh{tokens, 24, 20, 8, top_k};
  const int64_t T = sh.T, D = sh.D, F = sh.F, E = sh.E, K = sh.K;
  const auto x = randn(T * D), w1 = randn(E * F * D, 0.2f), w3 = randn(E * F * D, 0.2f),
             w2 = randn(E * D * F, 0.2f), dy = randn(T * D), rw = randn(T * K, 0.5f);
  std::vector<int32_t> idx(T * K);
  for (int64_t t = 0; t < T; ++t)  // K different experts of 0..6: expert 7 gets no token
    for (int64_t j = 0; j < K; ++j) idx[t * K + j] = static_cast<int32_t>((t * 3 + j * 5) % 7);
  // The weight gradients accumulate (+=) onto what is there. The reference in double.
  const auto dw1_0 = randn(E * F * D, 0.1f), dw3_0 = randn(E * F * D, 0.1f),
             dw2_0 = randn(E * D * F, 0.1f);
  std::vector<double> y(T * D, 0), dx(T * D, 0), dw(T * K, 0), dw1(dw1_0.begin(), dw1_0.end()),
      dw3(dw3_0.begin(), dw3_0.end()), dw2(dw2_0.begin(), dw2_0.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = idx[t * K + j];
      const double wt = rw[t * K + j];
      std::vector<double> a(F, 0), b(F, 0), sg(F), g(F), yp(D, 0), dg(F, 0);
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t c = 0; c < D; ++c) {
          a[f] += static_cast<double>(w1[(e * F + f) * D + c]) * x[t * D + c];
          b[f] += static_cast<double>(w3[(e * F + f) * D + c]) * x[t * D + c];
        }
        sg[f] = 1 / (1 + std::exp(-a[f]));
        g[f] = a[f] * sg[f] * b[f];
      }
      for (int64_t c = 0; c < D; ++c)
        for (int64_t f = 0; f < F; ++f)
          yp[c] += static_cast<double>(w2[(e * D + c) * F + f]) * g[f];
      for (int64_t c = 0; c < D; ++c) {
        y[t * D + c] += wt * yp[c];
        dw[t * K + j] += dy[t * D + c] * yp[c];
        for (int64_t f = 0; f < F; ++f) {
          dg[f] += static_cast<double>(w2[(e * D + c) * F + f]) * wt * dy[t * D + c];
          dw2[(e * D + c) * F + f] += wt * dy[t * D + c] * g[f];
        }
      }
      for (int64_t f = 0; f < F; ++f) {
        const double da = dg[f] * b[f] * (sg[f] * (1 + a[f] * (1 - sg[f]))),
                     db = dg[f] * a[f] * sg[f];
        for (int64_t c = 0; c < D; ++c) {
          dx[t * D + c] += w1[(e * F + f) * D + c] * da + w3[(e * F + f) * D + c] * db;
          dw1[(e * F + f) * D + c] += da * x[t * D + c];
          dw3[(e * F + f) * D + c] += db * x[t * D + c];
        }
      }
    }
  auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<uint16_t> w1h(w1.size()), w3h(w3.size()), w2h(w2.size());
  ops::to_bf16(w1.data(), E * F * D, w1h.data());
  ops::to_bf16(w3.data(), E * F * D, w3h.data());
  ops::to_bf16(w2.data(), E * D * F, w2h.data());
  for (const bool bf16 : {false, true}) {
    const ops::GroupedExpertsOp op = cu::grouped_experts_op(bf16);
    const std::string name = std::string("grouped_experts") + (bf16 ? " bf16" : "") +
                             " T=" + std::to_string(T) + " K=" + std::to_string(K);
    const double tol = bf16 ? 2e-2 : 1e-5;
    Dev<float> d_x(x), d_w1(w1), d_w3(w3), d_w2(w2), d_dy(dy), d_rw(rw), d_y(T * D), d_dx(T * D),
        d_dw(T * K), d_dw1(dw1_0), d_dw3(dw3_0), d_dw2(dw2_0), d_saved(op.saved_floats(sh)),
        d_scratch(op.scratch_floats(sh));
    Dev<uint16_t> d_w1h(w1h), d_w3h(w3h), d_w2h(w2h);
    Dev<int32_t> d_idx(idx);
    ops::ExpertsArgs a;
    a.s = sh;
    a.x = d_x.p;
    a.idx = d_idx.p;
    a.w = d_rw.p;
    a.w1 = d_w1.p;
    a.w3 = d_w3.p;
    a.w2 = d_w2.p;
    a.saved = d_saved.p;
    a.scratch = d_scratch.p;
    if (bf16) {
      a.w1_bf16 = d_w1h.p;
      a.w3_bf16 = d_w3h.p;
      a.w2_bf16 = d_w2h.p;
    }
    op.forward(a, d_y.p);
    report(name + " y", rel_diff(d_y.host(), f32(y)), tol);
    ops::ExpertsGrads g;
    g.dy = d_dy.p;
    g.dx = d_dx.p;
    g.dw = d_dw.p;
    g.dw1 = d_dw1.p;
    g.dw3 = d_dw3.p;
    g.dw2 = d_dw2.p;
    op.backward(a, g);
    report(name + " dx", rel_diff(d_dx.host(), f32(dx)), tol);
    report(name + " dw (routing weights)", rel_diff(d_dw.host(), f32(dw)), tol);
    report(name + " dw1", rel_diff(d_dw1.host(), f32(dw1)), tol);
    report(name + " dw3", rel_diff(d_dw3.host(), f32(dw3)), tol);
    report(name + " dw2", rel_diff(d_dw2.host(), f32(dw2)), tol);
    // Frozen experts (no weight gradients asked): dx and dw the same.
    g.dw1 = g.dw3 = g.dw2 = nullptr;
    Dev<float> d_dx2(T * D), d_dw_2(T * K);
    g.dx = d_dx2.p;
    g.dw = d_dw_2.p;
    op.backward(a, g);
    report(name + " frozen: dx", rel_diff(d_dx2.host(), f32(dx)), tol);
    report(name + " frozen: dw (routing weights)", rel_diff(d_dw_2.host(), f32(dw)), tol);
    std::vector<int32_t> bad_idx = idx;
    bad_idx[2 * K - 1] = static_cast<int32_t>(E);  // token 1, slot K-1
    Dev<int32_t> d_bad(bad_idx);
    a.idx = d_bad.p;
    std::string msg;
    try {
      op.forward(a, d_y.p);
    } catch (const titan::Error& e) {
      msg = e.what();
    }
    report(name + " refuses an expert index outside [0, E)",
           msg.find("expert index 8 of token 1 slot " + std::to_string(K - 1) +
                    " is outside [0, 8)") == std::string::npos,
           0);
  }
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Worst |Δ| / (Σ_k |a·b|) of C = op(A)·op(B) (+ C0) against a double product.
double gemm_err(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                int64_t lda, const std::vector<float>& B, int64_t ldb, const std::vector<float>& C0,
                const std::vector<float>& C, int64_t ldc, bool acc) {
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = acc ? C0[i * ldc + j] : 0.0, mag = acc ? std::fabs(C0[i * ldc + j]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
        mag += std::fabs(a * b);
      }
      worst = std::max(worst, std::fabs(C[i * ldc + j] - s) / std::max(mag, 1e-30));
    }
  return worst;
}

void test_gemm() {
  struct Case {
    int64_t M, N, K;
    bool ta, tb, acc;
  };
  for (const Case c : {Case{1, 1, 1, false, false, false}, Case{37, 51, 70, false, true, false},
                       Case{37, 51, 70, true, false, true}, Case{64, 128, 256, true, true, true},
                       Case{17, 1000, 33, false, false, true}, Case{5, 7, 0, false, true, true}}) {
    const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 1, ldc = c.N + 2;
    const int64_t arows = c.ta ? c.K : c.M, brows = c.tb ? c.N : c.K;
    auto A = randn(static_cast<size_t>(std::max<int64_t>(1, arows * lda)));
    auto B = randn(static_cast<size_t>(std::max<int64_t>(1, brows * ldb)));
    const auto C0 = randn(c.M * ldc);
    char at[96];
    std::snprintf(at, sizeof at, " %lldx%lldx%lld%s%s%s", static_cast<long long>(c.M),
                  static_cast<long long>(c.N), static_cast<long long>(c.K), c.ta ? " At" : "",
                  c.tb ? " Bt" : "", c.acc ? " +=" : "");
    {
      Dev<float> dA(A), dB(B), dC(C0);
      cu::gemm(c.ta, c.tb, c.M, c.N, c.K, dA.p, lda, dB.p, ldb, dC.p, ldc, c.acc);
      report(std::string("gemm") + at,
             gemm_err(c.ta, c.tb, c.M, c.N, c.K, A, lda, B, ldb, C0, dC.host(), ldc, c.acc), 1e-5);
    }
    // bf16: the same values rounded to bf16 on both sides.
    std::vector<uint16_t> A16(A.size()), B16(B.size());
    ops::to_bf16(A.data(), static_cast<int64_t>(A.size()), A16.data());
    ops::to_bf16(B.data(), static_cast<int64_t>(B.size()), B16.data());
    for (size_t i = 0; i < A.size(); ++i) A[i] = bf16_to_f32(A16[i]);
    for (size_t i = 0; i < B.size(); ++i) B[i] = bf16_to_f32(B16[i]);
    Dev<uint16_t> dA(A16), dB(B16);
    Dev<float> dC(C0);
    cu::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, dA.p, lda, dB.p, ldb, dC.p, ldc, c.acc);
    report(std::string("gemm_bf16") + at,
           gemm_err(c.ta, c.tb, c.M, c.N, c.K, A, lda, B, ldb, C0, dC.host(), ldc, c.acc), 1e-5);
  }
}

void test_linear() {
  const int64_t M = 37, in = 70, out = 51;
  const auto x = randn(M * in), w = randn(out * in), dy = randn(M * out), dx0 = randn(M * in),
             dw0 = randn(out * in);
  Dev<float> d_x(x), d_w(w), d_dy(dy), d_y(M * out), d_dx(dx0), d_dw(dw0);
  cu::linear_fwd(d_x.p, d_w.p, d_y.p, M, in, out);
  report("linear_fwd", gemm_err(false, true, M, out, in, x, in, w, in, {}, d_y.host(), out, false),
         1e-5);
  cu::linear_bwd(d_dy.p, d_x.p, d_w.p, d_dx.p, d_dw.p, M, in, out, true);
  report("linear_bwd dx +=",
         gemm_err(false, false, M, in, out, dy, out, w, in, dx0, d_dx.host(), in, true), 1e-5);
  report("linear_bwd dw +=",
         gemm_err(true, false, out, in, M, dy, out, x, in, dw0, d_dw.host(), in, true), 1e-5);
  // bf16: x and dy rounded inside, w already bf16.
  std::vector<uint16_t> w16(w.size()), x16(x.size()), dy16(dy.size());
  ops::to_bf16(w.data(), out * in, w16.data());
  ops::to_bf16(x.data(), M * in, x16.data());
  ops::to_bf16(dy.data(), M * out, dy16.data());
  std::vector<float> wr(w.size()), xr(x.size()), dyr(dy.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(w16[i]);
  for (size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_f32(x16[i]);
  for (size_t i = 0; i < dy.size(); ++i) dyr[i] = bf16_to_f32(dy16[i]);
  Dev<uint16_t> d_w16(w16), d_scratch(M * (in + out));
  Dev<float> d_y2(M * out), d_dx2(dx0), d_dw2(dw0);
  cu::linear_fwd_bf16(d_x.p, d_w16.p, d_y2.p, M, in, out, d_scratch.p);
  report("linear_fwd_bf16",
         gemm_err(false, true, M, out, in, xr, in, wr, in, {}, d_y2.host(), out, false), 1e-5);
  cu::linear_bwd_bf16(d_dy.p, d_x.p, d_w16.p, d_dx2.p, d_dw2.p, M, in, out, true, d_scratch.p);
  report("linear_bwd_bf16 dx +=",
         gemm_err(false, false, M, in, out, dyr, out, wr, in, dx0, d_dx2.host(), in, true), 1e-5);
  report("linear_bwd_bf16 dw +=",
         gemm_err(true, false, out, in, M, dyr, out, xr, in, dw0, d_dw2.host(), in, true), 1e-5);
}

void test_optim() {
  const int64_t n = 300007;
  auto p = randn(n), g = randn(n, 1e-3f), m = randn(n, 1e-4f), v = randn(n, 1e-4f);
  for (auto& x : v) x = x * x;
  Dev<float> d_p(p), d_g(g), d_m(m), d_v(v);
  titan::optim::AdamWConfig c;
  for (int64_t step = 1; step <= 3; ++step) {
    titan::optim::adamw_step(p.data(), g.data(), m.data(), v.data(), n, c, 3e-4f, step);
    titan::optim::cuda::adamw_step(d_p.p, d_g.p, d_m.p, d_v.p, n, c, 3e-4f, step);
  }
  report("adamw_step p (3 steps)", rel_diff(d_p.host(), p), 2e-6);
  report("adamw_step exp_avg", rel_diff(d_m.host(), m), 2e-6);
  report("adamw_step exp_avg_sq", rel_diff(d_v.host(), v), 2e-6);
  const double want = titan::optim::sum_squares(g.data(), n),
               got = titan::optim::cuda::sum_squares(d_g.p, n);
  report("sum_squares", std::fabs(got - want) / want, 1e-12);
  const double again = titan::optim::cuda::sum_squares(d_g.p, n);
  report("sum_squares is deterministic", got != again, 0);
  titan::optim::clip_by_norm(g.data(), n, std::sqrt(want), 0.5);
  titan::optim::cuda::clip_by_norm(d_g.p, n, std::sqrt(want), 0.5);
  report("clip_by_norm", rel_diff(d_g.host(), g), 0);
  // 8-bit moments: blocks of 256 from each start (a short block at 1000), 3 steps; the codes may
  // differ where the CPU's contracted FMAs move x/absmax across a midpoint (a few in 1e5).
  std::vector<int64_t> begin{0};
  for (int64_t b = 256; b < n; b += 256) {
    if (begin.back() < 1000 && b > 1000) begin.push_back(1000);
    begin.push_back(b);
  }
  begin.push_back(n);
  const auto nb = static_cast<int64_t>(begin.size()) - 1;
  std::vector<uint8_t> qm(n, 0), qv(n, 0);
  std::vector<float> am(nb, 0.0f), av(nb, 0.0f);
  auto p8 = randn(n);
  Dev<float> d_p8(p8), d_am(am), d_av(av);
  Dev<uint8_t> d_qm(qm), d_qv(qv);
  Dev<int64_t> d_begin(begin);
  for (int64_t step = 1; step <= 3; ++step) {
    titan::optim::adamw_step_q8(p8.data(), g.data(), qm.data(), qv.data(), am.data(), av.data(),
                                begin.data(), nb, c, 3e-4f, step);
    titan::optim::cuda::adamw_step_q8(d_p8.p, d_g.p, d_qm.p, d_qv.p, d_am.p, d_av.p, d_begin.p, nb,
                                      c, 3e-4f, step);
  }
  report("adamw_step_q8 p (3 steps)", rel_diff(d_p8.host(), p8), 2e-6);
  report("adamw_step_q8 absmax m", rel_diff(d_am.host(), am), 2e-6);
  report("adamw_step_q8 absmax v", rel_diff(d_av.host(), av), 2e-6);
  const auto hq = d_qm.host();
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i)
    differ += hq[static_cast<size_t>(i)] != qm[static_cast<size_t>(i)];
  report("adamw_step_q8 codes of m differing (fraction)",
         static_cast<double>(differ) / static_cast<double>(n), 1e-4);
}

// cuBLASLt's rate on an n³ product: bf16 (fp32 accumulation) and fp32.
void probe(int64_t n) {
  for (const bool bf16 : {true, false}) {
    Dev<uint16_t> a16(bf16 ? n * n : 1), b16(bf16 ? n * n : 1);
    Dev<float> a(bf16 ? 1 : n * n), b(bf16 ? 1 : n * n), c(n * n);
    auto run = [&] {
      if (bf16)
        cu::gemm_bf16(false, false, n, n, n, a16.p, n, b16.p, n, c.p, n, false);
      else
        cu::gemm(false, false, n, n, n, a.p, n, b.p, n, c.p, n, false);
    };
    run();
    cu::synchronize();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 5; ++i) run();
      cu::synchronize();
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5);
    }
    std::printf("probe: cuBLASLt %s GEMM %lld^3: %.1f TFLOP/s\n", bf16 ? "bf16" : "fp32",
                static_cast<long long>(n), 2.0 * n * n * n / best / 1e12);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (cu::device_count(&why) == 0) {
    std::printf("skipped: %s; the CUDA ops were compiled, not run\n", why.c_str());
    return 77;
  }
  try {
    std::printf("device: %s\n", cu::describe_device().c_str());
    test_embedding();
    test_reserved_memory();
    test_rmsnorm();
    test_rope_swiglu_add();
    test_attention();
    test_attention_cached();
    test_lm_head_ce();
    test_router();
    test_experts(50, 2);
    test_experts(300, 2);
    test_experts(37, 1);
    test_gemm();
    test_linear();
    test_optim();
    if (argc > 1 && std::string(argv[1]) == "--probe") probe(8192);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d check(s) failed\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
