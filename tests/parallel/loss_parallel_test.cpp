// Vocab-parallel lm_head + cross-entropy (train/loss_parallel.h) against the single-rank chunked
// loss ops::lm_head_ce over the whole weight, on the same h, weight and labels (seeded, so every
// rank builds them alike): the loss sum and count, dh (whole on every rank) and this rank's rows
// of dw. Odd sizes: V = 101 split unevenly (torch's Shard(0) chunks, a rank may get none), T = 37
// in chunks of 8 (a short last chunk), ignored labels, labels on the shard edges.
//
// Tolerances: the loss within 1e-6 relative (the log-sum-exp is added over ranks in pieces, and
// titan's single-rank kernel uses a fast exp), dh and dw within 1e-5 relative plus 1e-6 of the
// tensor's scale (fp32 sums of ≤ 101 O(1) terms, ~1e-7 apart).
//
// LossParallelRanks.* run under mpirun (skipped otherwise); LossParallel.OnTwoAndThreeRanks
// launches them on 2 and 3 ranks; LossParallel.OneProcess runs the same with a group of one.
#include "titan/parallel/loss_parallel.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "../ops/reference_util.h"
#include "test_util.h"

namespace titan::parallel {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

void check_on(dist::Communicator& c) {
  const int64_t T = 37, D = 24, V = 101;
  std::mt19937 g(11);
  const std::vector<float> h = uniform(T * D, g, -1, 1), w = uniform(V * D, g, -0.5f, 0.5f);
  std::vector<int32_t> labels(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) labels[size_t(t)] = static_cast<int32_t>(g() % V);
  labels[3] = labels[20] = ops::kIgnoreIndex;
  labels[5] = 0;
  labels[6] = static_cast<int32_t>(V - 1);
  for (int p = 2; p <= 3; ++p)
    labels[size_t(6 + p)] = static_cast<int32_t>(parallel::vocab_shard(V, 1, p).begin);
  const float scale = 1.0f / 35;

  for (int64_t chunk : {8, 64}) {
    std::vector<float> dh1(h.size()), dw1(w.size(), 0.f);
    std::vector<float> s1(static_cast<size_t>(ops::lm_head_ce_scratch(T, V, chunk)));
    const ops::LossSum one = ops::lm_head_ce(h.data(), w.data(), labels.data(), T, D, V, chunk,
                                             scale, dh1.data(), dw1.data(), s1.data());
    const parallel::VocabShard sh = parallel::vocab_shard(V, c.rank(), c.size());
    std::vector<float> dh(h.size(), -1.f), dw(static_cast<size_t>(sh.rows * D), 0.f);
    std::vector<float> s(static_cast<size_t>(parallel::lm_head_ce_vocab_parallel_scratch(T, sh.rows, chunk)));
    const ops::LossSum got =
        parallel::lm_head_ce_vocab_parallel(h.data(), w.data() + sh.begin * D, sh, V, labels.data(), T, D,
                                  chunk, scale, dh.data(), dw.data(), s.data(), c);
    const std::string what = "chunk " + std::to_string(chunk) + " rank " + std::to_string(c.rank());
    EXPECT_EQ(got.count, one.count) << what;
    EXPECT_NEAR(got.sum, one.sum, 1e-6 * std::abs(one.sum)) << what;
    expect_close(what + " dh", dh, std::vector<double>(dh1.begin(), dh1.end()), 1e-5, 1e-6);
    expect_close(
        what + " dw", dw,
        std::vector<double>(dw1.begin() + sh.begin * D, dw1.begin() + (sh.begin + sh.rows) * D),
        1e-5, 1e-6);
    // Loss only (no gradient): the same sum.
    const ops::LossSum fwd =
        parallel::lm_head_ce_vocab_parallel(h.data(), w.data() + sh.begin * D, sh, V, labels.data(), T, D,
                                  chunk, 0.f, nullptr, nullptr, s.data(), c);
    EXPECT_EQ(fwd.sum, got.sum) << what;
  }
}

TEST(LossParallel, VocabShardsAsTorchShardsDimZero) {
  // torch.chunk of 101 rows in 3: 34, 34, 33; of 5 rows in 4: 2, 2, 1, 0.
  EXPECT_EQ(parallel::vocab_shard(101, 2, 3).begin, 68);
  EXPECT_EQ(parallel::vocab_shard(101, 2, 3).rows, 33);
  EXPECT_EQ(parallel::vocab_shard(5, 2, 4).rows, 1);
  EXPECT_EQ(parallel::vocab_shard(5, 3, 4).rows, 0);
  EXPECT_EQ(parallel::vocab_shard(5, 3, 4).begin, 5);
}

TEST(LossParallel, OneProcess) {
  auto c = dist::single_process();
  check_on(*c);
}

TEST(LossParallelRanks, AgainstOneRank) {
  if (!dist::launched_by_mpi())
    GTEST_SKIP() << "runs under mpirun (LossParallel.OnTwoAndThreeRanks)";
  check_on(dist::world());
}

TEST(LossParallel, OnTwoAndThreeRanks) {
  if (dist::launched_by_mpi()) GTEST_SKIP() << "the launcher itself";
  for (int np : {2, 3}) TITAN_EXPECT_PASSES_ON_RANKS(np, "LossParallelRanks.*");
}

}  // namespace
}  // namespace titan::parallel
