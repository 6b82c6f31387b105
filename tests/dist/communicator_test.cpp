// The communicator's collectives on three ranks (an odd size, so no power-of-two shortcut hides a
// mistake) and on one process. Values are small integers, so every float sum is exact and the
// expected results are exact whatever MPI's reduction order.
//
// CommunicatorRanks.* run only under mpirun (skipped otherwise); Communicator.OnThreeRanks
// launches them: this test binary under `mpirun -np 3`. Skipped where mpirun is absent
// (scripts/install-deps.sh installs OpenMPI).
#include "titan/dist/communicator.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace titan::dist {
namespace {

std::vector<int64_t> counts_for(int size) {  // rank r owns r + 1 values
  std::vector<int64_t> c;
  for (int r = 0; r < size; ++r) c.push_back(r + 1);
  return c;
}

void check_collectives(Communicator& c) {
  const int p = c.size(), me = c.rank();

  std::vector<float> x = {float(me), 1.f, float(2 * me)};
  c.all_reduce(x.data(), 3);
  const float s = float(p * (p - 1) / 2);
  EXPECT_EQ(x, (std::vector<float>{s, float(p), 2 * s}));
  std::vector<int64_t> m = {me};
  c.all_reduce(m.data(), 1, ReduceOp::max);
  EXPECT_EQ(m[0], p - 1);
  std::vector<double> d = {0.5 * me};
  c.all_reduce(d.data(), 1);
  EXPECT_EQ(d[0], 0.5 * s);
  std::vector<float> y = {float(me), 3.f};
  c.all_reduce_async(y.data(), 2)->wait();
  EXPECT_EQ(y, (std::vector<float>{s, 3.f * p}));

  // Reduce-scatter: value i of every rank's buffer is i + rank; rank r gets block r summed.
  const auto counts = counts_for(p);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < p; ++r) (r < me ? offset : total) += counts[static_cast<size_t>(r)];
  total += offset;
  std::vector<float> in(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) in[static_cast<size_t>(i)] = float(i + me);
  for (bool async : {false, true}) {
    std::vector<float> out(static_cast<size_t>(counts[size_t(me)]), -1.f);
    if (async)
      c.reduce_scatter_async(in.data(), out.data(), counts)->wait();
    else
      c.reduce_scatter(in.data(), out.data(), counts);
    for (int64_t i = 0; i < counts[static_cast<size_t>(me)]; ++i)
      EXPECT_EQ(out[static_cast<size_t>(i)], float(p * (offset + i)) + s)
          << "async " << async << " i " << i;
  }

  // All-gather in place: every rank fills its own block with 100·rank + i.
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> g(static_cast<size_t>(total), -1.f);
    std::vector<uint16_t> h(static_cast<size_t>(total), 65535);
    for (int64_t i = 0; i < counts[static_cast<size_t>(me)]; ++i) {
      g[static_cast<size_t>(offset + i)] = float(100 * me + i);
      h[static_cast<size_t>(offset + i)] = uint16_t(100 * me + i);
    }
    if (variant == 0) c.all_gather(g.data(), counts);
    if (variant == 1) c.all_gather_async(g.data(), counts)->wait();
    if (variant == 2) c.all_gather_async(h.data(), counts)->wait();
    int64_t o = 0;
    for (int r = 0; r < p; ++r)
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++o) {
        if (variant == 2)
          EXPECT_EQ(h[static_cast<size_t>(o)], 100 * r + i);
        else
          EXPECT_EQ(g[static_cast<size_t>(o)], float(100 * r + i)) << "variant " << variant;
      }
  }

  // All-to-all(v): rank p sends q + 1 values to rank q, each 1000·p + 10·q + i. Split sizes are
  // exchanged first, as expert parallelism's dispatch does.
  std::vector<int64_t> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) send[static_cast<size_t>(q)] = q + 1 + me;
  c.all_to_all(send.data(), recv.data(), 1);
  for (int q = 0; q < p; ++q) EXPECT_EQ(recv[static_cast<size_t>(q)], me + 1 + q);
  std::vector<float> a;
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < send[static_cast<size_t>(q)]; ++i)
      a.push_back(float(1000 * me + 10 * q + i));
  int64_t rtotal = 0;
  for (int64_t v : recv) rtotal += v;
  for (bool async : {false, true}) {
    std::vector<float> b(static_cast<size_t>(rtotal), -1.f);
    if (async)
      c.all_to_all_async(a.data(), send, b.data(), recv)->wait();
    else
      c.all_to_all(a.data(), send, b.data(), recv);
    int64_t o = 0;
    for (int q = 0; q < p; ++q)
      for (int64_t i = 0; i < recv[static_cast<size_t>(q)]; ++i, ++o)
        EXPECT_EQ(b[static_cast<size_t>(o)], float(1000 * q + 10 * me + i)) << "async " << async;
  }

  // Broadcast from the last rank.
  std::vector<int> bc = {me, 7};
  c.broadcast(bc.data(), sizeof(int) * 2, p - 1);
  EXPECT_EQ(bc, (std::vector<int>{p - 1, 7}));
  c.barrier();

  // Split into even and odd ranks, ranked in reverse.
  auto sub = c.split(me % 2, -me);
  int expect_size = 0, expect_rank = 0;
  for (int r = 0; r < p; ++r)
    if (r % 2 == me % 2) {
      ++expect_size;
      expect_rank += r > me;
    }
  EXPECT_EQ(sub->size(), expect_size);
  EXPECT_EQ(sub->rank(), expect_rank);
  std::vector<int64_t> one = {1};
  sub->all_reduce(one.data(), 1);
  EXPECT_EQ(one[0], expect_size);
}

TEST(Communicator, SingleProcess) {
  auto c = single_process();
  EXPECT_EQ(c->size(), 1);
  check_collectives(*c);
  EXPECT_EQ(c->bytes_sent(), 0);
}

TEST(CommunicatorRanks, AllCollectives) {
  if (!launched_by_mpi()) GTEST_SKIP() << "runs under mpirun (Communicator.OnThreeRanks)";
  Communicator& c = world();
  EXPECT_EQ(c.backend(), "mpi");
  EXPECT_EQ(c.size(), 3);
  check_collectives(c);
  EXPECT_GT(c.bytes_sent(), 0);
}

TEST(Communicator, OnThreeRanks) {
  if (launched_by_mpi()) GTEST_SKIP() << "the launcher itself";
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "mpirun not found (scripts/install-deps.sh installs OpenMPI)";
  std::string self(4096, '\0');  // this test binary, launched on three ranks
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
  ASSERT_GT(n, 0);
  self.resize(static_cast<size_t>(n));
  const std::string run =
      "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 -x OMP_NUM_THREADS=1 " + self +
      " --gtest_color=no --gtest_filter=CommunicatorRanks.* 2>&1";
  FILE* f = popen(run.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, f)) out.append(buf, k);
  const int status = pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_EQ(out.find("SKIPPED"), std::string::npos) << out;
  int passed = 0;  // one per rank
  for (size_t at = out.find("[  PASSED  ] 1 test"); at != std::string::npos;
       at = out.find("[  PASSED  ] 1 test", at + 1))
    ++passed;
  EXPECT_EQ(passed, 3) << out;
}

}  // namespace
}  // namespace titan::dist
