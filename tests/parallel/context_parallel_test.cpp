// Context-parallel attention (models/context_parallel.h over parallel/context_parallel.h's hooks)
// against the single-rank op on the whole sequence: every rank builds the same global q, k, v,
// positions and dout (seeded), keeps its head-tail chunks of each row (split_rows), and runs
// ContextAttention's forward and backward; o, lse, dq, dk and dv must be the whole call's rows
// of this rank. Rows of 96 tokens (chunks of 48, 24 and 16 on 1, 2 and 3 ranks; 12 on 4), B = 2,
// GQA 4/2, block-causal documents that cross the chunk edges (starts at 0, 5, 30, 47, 70, 90 in
// row 0; row 1 starts mid-document and has starts at 13 and 49), and plain causal.
//
// Tolerance: 1e-6 relative plus 1e-6 of each tensor's largest magnitude. o, lse and dq are the
// same kernel's sums over the same key tiles (equal to rounding); dk and dv add the chunks'
// terms in another order (per chunk, then over the ranks) — fp32 sums of ≤ 96 terms.
//
// ContextParallelRanks.* run under mpirun (skipped otherwise); ContextParallel.OnTwoToFourRanks
// launches them on 2, 3 and 4 ranks; ContextParallel.OneProcess runs the same with a group of
// one (the backend's attention itself).
#include "titan/parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../ops/reference_util.h"
#include "test_util.h"
#include "titan/ops/backend.h"

namespace titan::parallel {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

// This rank's head-tail rows of x[B·S, w] (split_rows' layout for w floats per token).
std::vector<float> local_rows(const std::vector<float>& x, int64_t B, int64_t S, int64_t w,
                              const models::CpSlice& sl) {
  const int64_t Sl = S / sl.size;
  std::vector<float> out(static_cast<size_t>(B * Sl * w));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sl; ++i) {
      const int64_t g = sl.global_index(i, Sl);
      std::copy_n(x.begin() + (b * S + g) * w, w, out.begin() + (b * Sl + i) * w);
    }
  return out;
}

void check_on(dist::Communicator& comm, bool block_causal) {
  const int64_t B = 2, S = 96, Hq = 4, Hkv = 2, d = 16, Q = Hq * d, KV = Hkv * d;
  const ops::Backend& be = ops::backend("cpu", "float32");
  std::mt19937 g(3);
  const std::vector<float> q = uniform(B * S * Q, g, -2, 2), k = uniform(B * S * KV, g, -2, 2),
                           v = uniform(B * S * KV, g, -2, 2), dout = uniform(B * S * Q, g, -1, 1);
  std::vector<int32_t> pos(static_cast<size_t>(B * S));
  const std::vector<std::vector<int>> starts = {{0, 5, 30, 47, 70, 90}, {13, 49}};
  for (int64_t b = 0; b < B; ++b) {
    int32_t p = b == 0 ? 0 : 9;
    for (int64_t i = 0; i < S; ++i) {
      for (int st : starts[static_cast<size_t>(b)]) p = i == st ? 0 : p;
      pos[static_cast<size_t>(b * S + i)] = p++;
    }
  }
  // The whole sequence, one call.
  const ops::AttnShape s{B, S, Hq, Hkv, d, 0.25f, Q, KV, KV};
  std::vector<float> ws(static_cast<size_t>(be.attention_workspace(s)));
  std::vector<int32_t> seg(pos.size());
  be.attention_segments(pos.data(), B, S, block_causal, seg.data());
  std::vector<float> o(q.size()), lse(static_cast<size_t>(B * Hq * S)), delta(lse.size());
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  be.attention_fwd(s, q.data(), k.data(), v.data(), seg.data(), o.data(), lse.data(), ws.data());
  be.attention_bwd(s, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), seg.data(),
                   dq.data(), dk.data(), dv.data(), delta.data(), ws.data());

  // This rank's chunks.
  ContextParallel hooks(comm);
  const models::CpSlice sl = hooks.slice();
  const int64_t Sl = S / sl.size;
  models::ContextAttention cp(sl, &hooks);
  const std::vector<float> lq = local_rows(q, B, S, Q, sl), lk = local_rows(k, B, S, KV, sl),
                           lv = local_rows(v, B, S, KV, sl), ldout = local_rows(dout, B, S, Q, sl);
  std::vector<int32_t> lpos(static_cast<size_t>(B * Sl)), lseg(lpos.size());
  split_rows(pos.data(), B, S, sl, lpos.data());
  cp.segments(be, lpos.data(), B, Sl, block_causal, lseg.data());
  const ops::AttnShape ls{B, Sl, Hq, Hkv, d, 0.25f, Q, KV, KV};
  std::vector<float> lws(static_cast<size_t>(be.attention_workspace(ls)));
  std::vector<float> lo(lq.size()), llse(static_cast<size_t>(B * Hq * Sl)), ldelta(llse.size());
  std::vector<float> ldq(lq.size()), ldk(lk.size(), -1.f), ldv(lv.size(), -1.f);
  cp.forward(be, ls, lq.data(), lk.data(), lv.data(), lseg.data(), lo.data(), llse.data(),
             lws.data());
  cp.backward(be, ls, lq.data(), lk.data(), lv.data(), lo.data(), llse.data(), ldout.data(),
              lseg.data(), ldq.data(), ldk.data(), ldv.data(), ldelta.data(), lws.data());

  auto rows = [&](const std::vector<float>& x, int64_t w) {
    const std::vector<float> r = local_rows(x, B, S, w, sl);
    return std::vector<double>(r.begin(), r.end());
  };
  std::vector<double> want_lse;  // [B, Hq, Sl]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sl; ++i)
        want_lse.push_back(lse[static_cast<size_t>((b * Hq + h) * S + sl.global_index(i, Sl))]);
  const std::string what = std::string(block_causal ? "block-causal" : "causal") + " rank " +
                           std::to_string(comm.rank()) + " of " + std::to_string(comm.size());
  const double tol = 1e-6;
  expect_close(what + " o", lo, rows(o, Q), tol, tol);
  expect_close(what + " lse", llse, want_lse, tol, tol);
  expect_close(what + " dq", ldq, rows(dq, Q), tol, tol);
  expect_close(what + " dk", ldk, rows(dk, KV), tol, tol);
  expect_close(what + " dv", ldv, rows(dv, KV), tol, tol);
}

TEST(ContextParallel, HeadTailChunks) {
  // 2 ranks, rows of 8: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const std::vector<int32_t> row = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> r0(4), r1(4);
  split_rows(row.data(), 1, 8, {0, 2}, r0.data());
  split_rows(row.data(), 1, 8, {1, 2}, r1.data());
  EXPECT_EQ(r0, (std::vector<int32_t>{0, 1, 6, 7}));
  EXPECT_EQ(r1, (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ((models::CpSlice{1, 2}.global_index(3, 4)), 5);
}

TEST(ContextParallel, OneProcess) {
  auto c = dist::single_process();
  check_on(*c, true);
  check_on(*c, false);
}

TEST(ContextParallelRanks, AgainstOneRank) {
  if (!dist::launched_by_mpi())
    GTEST_SKIP() << "runs under mpirun (ContextParallel.OnTwoToFourRanks)";
  check_on(dist::world(), true);
  check_on(dist::world(), false);
}

TEST(ContextParallel, OnTwoToFourRanks) {
  if (dist::launched_by_mpi()) GTEST_SKIP() << "the launcher itself";
  for (int np : {2, 3, 4}) TITAN_EXPECT_PASSES_ON_RANKS(np, "ContextParallelRanks.*");
}

}  // namespace
}  // namespace titan::parallel
