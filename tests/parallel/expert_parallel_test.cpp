// Expert parallelism's dispatch and combine (train/expert_parallel.h) against the wrapped
// grouped-experts op on one process over every rank's tokens: the same global problem (seeded,
// so every rank builds it alike), rank r holding tokens [r·T, (r+1)·T) and experts
// [r·E/P, (r+1)·E/P) (only those experts' weights passed to the op, as the model holds them).
//
//  * y, dx, dw (the routing weights' gradient) of this rank's tokens and dw1, dw3, dw2 of its
//    experts equal the one-process op's within 1e-5 relative plus 1e-6 of the tensor's scale
//    (the expert weight gradients sum the same rows in another order; fp32 sums of at most
//    T·K·P rows of O(1) terms are ~1e-7 relative apart); the other experts' gradients stay 0.
//  * Two layers interleaved (forward 0, forward 1, backward 1, backward 0) keep their own state,
//    with an op each sharing the exchange buffers (as the trainer builds them) or one op.
//  * Routings that leave a rank's experts without tokens, and every token on one rank's experts.
//  * Both built-in kernels as the wrapped op (the oneDNN grouped GEMMs and the plain loop that
//    stands in for a plugin's kernel).
//  * The bytes sent equal the theory: per layer, the routed rows leaving this rank (to other
//    ranks) and coming back, D floats each, forward and backward (4 all-to-alls), plus one
//    float per row each way (the routing weight out, its gradient back) and the per-expert
//    counts (E/P int64 to each other rank).
//
// ExpertParallelRanks.* run under mpirun (skipped otherwise); ExpertParallel.OnTwoAndFourRanks
// launches them on 2 and 4 ranks. ExpertParallel.OneProcess runs the same checks with a group of
// one.
#include "titan/parallel/expert_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "../ops/reference_util.h"
#include "test_util.h"
#include "titan/core/error.h"

namespace titan::parallel {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

enum class Routing { random, skip_last_rank, all_on_rank0 };

struct Problem {
  ops::ExpertsShape s;  // the global shape: T = all ranks' tokens
  std::vector<float> x, w, w1, w3, w2, dy;
  std::vector<int32_t> idx;
};

// K distinct experts per token, drawn from the experts the routing allows.
Problem make_problem(int64_t T, int64_t E, int64_t K, int64_t D, int64_t F, Routing routing, int P,
                     uint32_t seed) {
  std::mt19937 g(seed);
  Problem p;
  p.s = {T, D, F, E, K};
  p.x = uniform(T * D, g, -1, 1);
  p.w = uniform(T * K, g, 0.1f, 1);
  const float a1 = 1 / std::sqrt(float(D)), a2 = 1 / std::sqrt(float(F));
  p.w1 = uniform(E * F * D, g, -a1, a1);
  p.w3 = uniform(E * F * D, g, -a1, a1);
  p.w2 = uniform(E * D * F, g, -a2, a2);
  p.dy = uniform(T * D, g, -1, 1);
  std::vector<int32_t> allowed;
  const int64_t El = E / P;
  for (int32_t e = 0; e < E; ++e) {
    if (routing == Routing::skip_last_rank && P > 1 && e / El == P - 1) continue;
    // rank 0's experts, and the next ones when it has fewer than K
    if (routing == Routing::all_on_rank0 && e >= std::max(El, K)) continue;
    allowed.push_back(e);
  }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool = allowed;
    std::shuffle(pool.begin(), pool.end(), g);
    for (int64_t j = 0; j < K; ++j) p.idx.push_back(pool[static_cast<size_t>(j)]);
  }
  return p;
}

struct Result {
  std::vector<float> y, dx, dw, dw1, dw3, dw2;
};

// Forward and backward of `op` on tokens [t0, t0 + T) of the problem, given the weights from
// expert e0 on (the one-process op: all of them; under EP: this rank's, as the model holds them)
// and their gradients' place in the Result's (all experts').
Result run(const ops::GroupedExpertsOp& op, const Problem& p, int64_t t0, int64_t T,
           std::vector<float>& saved, int64_t e0 = 0) {
  const ops::ExpertsShape& g = p.s;
  const int64_t n1 = e0 * g.F * g.D;
  ops::ExpertsArgs ea;
  ea.s = {T, g.D, g.F, g.E, g.K};
  ea.x = p.x.data() + t0 * g.D;
  ea.idx = p.idx.data() + t0 * g.K;
  ea.w = p.w.data() + t0 * g.K;
  ea.w1 = p.w1.data() + n1;
  ea.w3 = p.w3.data() + n1;
  ea.w2 = p.w2.data() + n1;
  saved.assign(static_cast<size_t>(op.saved_floats(ea.s)), 0);
  std::vector<float> scratch(static_cast<size_t>(op.scratch_floats(ea.s)));
  ea.saved = saved.data();
  ea.scratch = scratch.data();
  Result r;
  r.y.assign(static_cast<size_t>(T * g.D), -1);
  op.forward(ea, r.y.data());
  r.dx.assign(r.y.size(), -1);
  r.dw.assign(static_cast<size_t>(T * g.K), -1);
  r.dw1.assign(p.w1.size(), 0);
  r.dw3.assign(p.w3.size(), 0);
  r.dw2.assign(p.w2.size(), 0);
  ops::ExpertsGrads eg;
  eg.dy = p.dy.data() + t0 * g.D;
  eg.dx = r.dx.data();
  eg.dw = r.dw.data();
  eg.dw1 = r.dw1.data() + n1;
  eg.dw3 = r.dw3.data() + n1;
  eg.dw2 = r.dw2.data() + n1;
  op.backward(ea, eg);
  return r;
}

std::vector<double> slice(const std::vector<float>& v, int64_t begin, int64_t n) {
  return std::vector<double>(v.begin() + begin, v.begin() + begin + n);
}

constexpr double kRtol = 1e-5, kAtol = 1e-6;

void compare(const std::string& what, const Result& ep, const Result& one, const Problem& p,
             int64_t t0, int64_t T, int rank, int P) {
  const ops::ExpertsShape& s = p.s;
  expect_close(what + " y", ep.y, slice(one.y, t0 * s.D, T * s.D), kRtol, kAtol);
  expect_close(what + " dx", ep.dx, slice(one.dx, t0 * s.D, T * s.D), kRtol, kAtol);
  expect_close(what + " dw", ep.dw, slice(one.dw, t0 * s.K, T * s.K), kRtol, kAtol);
  const int64_t El = s.E / P, n1 = El * s.F * s.D;
  const struct {
    const char* name;
    const std::vector<float>&got, &want;
  } grads[] = {{"dw1", ep.dw1, one.dw1}, {"dw3", ep.dw3, one.dw3}, {"dw2", ep.dw2, one.dw2}};
  for (const auto& gr : grads) {
    // This rank's experts, then every other element untouched.
    const std::vector<float> mine(gr.got.begin() + rank * n1, gr.got.begin() + (rank + 1) * n1);
    expect_close(what + " " + gr.name, mine, slice(gr.want, rank * n1, n1), kRtol, kAtol);
    int64_t touched = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(gr.got.size()); ++i)
      if ((i < rank * n1 || i >= (rank + 1) * n1) && gr.got[static_cast<size_t>(i)] != 0) ++touched;
    EXPECT_EQ(touched, 0) << what << " " << gr.name << ": other ranks' experts got gradients";
  }
}

// Routed rows of tokens [t0, t0+T) whose expert lives on another rank than `rank`, and rows of
// other ranks' tokens routed to `rank`'s experts.
int64_t rows_out(const Problem& p, int64_t t0, int64_t T, int rank, int P) {
  const int64_t El = p.s.E / P;
  int64_t n = 0;
  for (int64_t a = t0 * p.s.K; a < (t0 + T) * p.s.K; ++a)
    n += p.idx[static_cast<size_t>(a)] / El != rank;
  return n;
}
int64_t rows_in(const Problem& p, int64_t t0, int64_t T, int rank, int P) {
  const int64_t El = p.s.E / P;
  int64_t n = 0;
  for (int64_t a = 0; a < p.s.T * p.s.K; ++a)
    n += p.idx[static_cast<size_t>(a)] / El == rank && (a < t0 * p.s.K || a >= (t0 + T) * p.s.K);
  return n;
}

void check_on(dist::Communicator& c) {
  const int P = c.size(), r = c.rank();
  const int64_t T = 13, E = 8, K = 3, D = 24, F = 20;  // tokens per rank: odd, not a tile
  const ops::GroupedExpertsOp kernels[] = {ops::grouped_experts_op(),
                                           ops::grouped_experts_reference_op()};
  for (const auto& kernel : kernels)
    for (Routing routing : {Routing::random, Routing::skip_last_rank, Routing::all_on_rank0}) {
      const std::string what = kernel.name + " routing " + std::to_string(int(routing));
      const Problem p = make_problem(T * P, E, K, D, F, routing, P, 7 + int(routing));
      std::vector<float> saved_one;
      const Result one = run(kernel, p, 0, T * P, saved_one);
      const ops::GroupedExpertsOp ep = parallel::expert_parallel(kernel, c);
      EXPECT_EQ(ep.name, kernel.name + "+ep" + std::to_string(P));
      ep.check({T * P, D, F, E, K});
      const int64_t before = c.bytes_sent();
      std::vector<float> saved;
      const Result mine = run(ep, p, r * T, T, saved, r * (E / P));
      const int64_t moved = rows_out(p, r * T, T, r, P) + rows_in(p, r * T, T, r, P);
      EXPECT_EQ(c.bytes_sent() - before, moved * (2 * D + 1) * 4 + (P - 1) * (E / P) * 8) << what;
      compare(what, mine, one, p, r * T, T, r, P);
    }

  // Two layers interleaved: each layer's backward finds its own forward's rows.
  const Problem a = make_problem(T * P, E, K, D, F, Routing::random, P, 101);
  const Problem b = make_problem(T * P, E, K, D, F, Routing::skip_last_rank, P, 202);
  const ops::GroupedExpertsOp kernel = ops::grouped_experts_op();
  std::vector<float> sa, sb;
  const Result ra = run(kernel, a, 0, T * P, sa), rb = run(kernel, b, 0, T * P, sb);
  // One op per layer sharing the exchange buffers (as the trainer builds them), and one op
  // serving both layers.
  const auto buffers = parallel::dispatch_buffers();
  const ops::GroupedExpertsOp ep = parallel::expert_parallel(kernel, c, buffers),
                              ep1 = parallel::expert_parallel(kernel, c, buffers),
                              both = parallel::expert_parallel(kernel, c);
  auto args = [&](const Problem& p, std::vector<float>& saved) {
    ops::ExpertsArgs ea;
    ea.s = {T, D, F, E, K};
    ea.x = p.x.data() + r * T * D;
    ea.idx = p.idx.data() + r * T * K;
    ea.w = p.w.data() + r * T * K;
    const int64_t n1 = r * (E / P) * F * D;  // this rank's experts
    ea.w1 = p.w1.data() + n1;
    ea.w3 = p.w3.data() + n1;
    ea.w2 = p.w2.data() + n1;
    saved.assign(static_cast<size_t>(ep.saved_floats(ea.s)), 0);
    ea.saved = saved.data();
    return ea;
  };
  for (bool shared_op : {false, true}) {
    const ops::GroupedExpertsOp& op0 = shared_op ? both : ep;
    const ops::GroupedExpertsOp& op1 = shared_op ? both : ep1;
    std::vector<float> ka, kb;
    const ops::ExpertsArgs ea = args(a, ka), eb = args(b, kb);
    Result ma, mb;
    for (Result* m : {&ma, &mb}) {
      m->y.resize(static_cast<size_t>(T * D));
      m->dx.resize(static_cast<size_t>(T * D));
      m->dw.resize(static_cast<size_t>(T * K));
      m->dw1.assign(a.w1.size(), 0);
      m->dw3.assign(a.w3.size(), 0);
      m->dw2.assign(a.w2.size(), 0);
    }
    op0.forward(ea, ma.y.data());
    op1.forward(eb, mb.y.data());
    auto grads = [&](const Problem& p, Result& m) {
      ops::ExpertsGrads g;
      g.dy = p.dy.data() + r * T * D;
      g.dx = m.dx.data();
      g.dw = m.dw.data();
      const int64_t n1 = r * (E / P) * F * D;
      g.dw1 = m.dw1.data() + n1;
      g.dw3 = m.dw3.data() + n1;
      g.dw2 = m.dw2.data() + n1;
      return g;
    };
    op1.backward(eb, grads(b, mb));
    op0.backward(ea, grads(a, ma));
    const std::string how = shared_op ? "one op, " : "an op each, ";
    compare(how + "layer 0", ma, ra, a, r * T, T, r, P);
    compare(how + "layer 1", mb, rb, b, r * T, T, r, P);
  }
}

TEST(ExpertParallel, OneProcess) {
  auto c = dist::single_process();
  check_on(*c);
}

TEST(ExpertParallelRanks, AgainstOneProcess) {
  if (!dist::launched_by_mpi())
    GTEST_SKIP() << "runs under mpirun (ExpertParallel.OnTwoAndFourRanks)";
  dist::Communicator& c = dist::world();
  check_on(c);
  const ops::GroupedExpertsOp ep = parallel::expert_parallel(ops::grouped_experts_op(), c);
  try {
    ep.check({4, 8, 8, 8 * c.size() + 1, 2});
    ADD_FAILURE() << "num_experts not divisible by ep accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be divisible by ep (" + std::to_string(c.size())),
              std::string::npos)
        << e.what();
  }
}

TEST(ExpertParallel, OnTwoAndFourRanks) {
  if (dist::launched_by_mpi()) GTEST_SKIP() << "the launcher itself";
  for (int np : {2, 4}) TITAN_EXPECT_PASSES_ON_RANKS(np, "ExpertParallelRanks.*");
}

}  // namespace
}  // namespace titan::parallel
