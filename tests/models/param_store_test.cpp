// The parameter store's bf16 masters (training.dtype bfloat16): the copy-only ranges' fp32 pages
// are given back, an update widens one unit exactly and rounds it back stochastically: unbiased,
// so updates below half a bf16 step survive on average, and reproducible for a key.
#include "titan/models/param_store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "titan/core/dtype.h"
#include "titan/ops/backend.h"

namespace titan::models {
namespace {

// Two units of 4096 elements; unit 1's first 3072 are read only through the bf16 copy.
std::unique_ptr<ParamStore> bf16_store() {
  ParamStore::Layout lay{8192, {{0, 4096}, {4096, 8192}}, 0, {{4096, 3072}}};
  auto s = std::make_unique<ParamStore>(lay, ParamStore::Options{true, true, false, true},
                                        ops::backend("cpu", "bfloat16"));
  s->allocate();
  return s;
}

TEST(ParamStoreBf16Masters, UpdatesRoundStochasticallyWithoutBias) {
  std::unique_ptr<ParamStore> sp = bf16_store();
  ParamStore& s = *sp;
  float* p = s.param_data();
  for (int64_t i = 0; i < 8192; ++i) p[i] = 1.0f;  // bf16 steps of 2^-7 above 1
  s.release_masters();
  ASSERT_TRUE(s.masters_released());
  // An update of a quarter bf16 step: round-to-nearest would lose it everywhere.
  const float delta = 0.25f * std::ldexp(1.0f, -7);
  float* w = s.update_begin(1);
  for (int64_t i = 4096; i < 8192; ++i) {
    ASSERT_EQ(w[i], 1.0f) << i;  // widened exactly from the copy (and the fp32 master past it)
    w[i] += delta;
  }
  s.update_end(1, 42);
  s.widen_masters();
  const float* after = std::as_const(s).param_data();
  double sum = 0;
  int64_t up = 0;
  for (int64_t i = 4096; i < 4096 + 3072; ++i) {
    ASSERT_TRUE(after[i] == 1.0f || after[i] == 1.0f + std::ldexp(1.0f, -7)) << after[i];
    sum += after[i];
    up += after[i] != 1.0f;
  }
  // Each rounds up with probability 1/4: the mean is 1 + delta within 4 standard errors.
  const double se = std::ldexp(1.0, -7) * std::sqrt(0.25 * 0.75 / 3072);
  EXPECT_NEAR(sum / 3072, 1.0 + delta, 4 * se);
  EXPECT_GT(up, 0);
  // The fp32 master past the copy-only range kept the update exactly.
  EXPECT_EQ(after[8191], 1.0f + delta);
  // The same key rounds the same way.
  std::unique_ptr<ParamStore> tp = bf16_store();
  ParamStore& t = *tp;
  float* q = t.param_data();
  for (int64_t i = 0; i < 8192; ++i) q[i] = 1.0f;
  t.release_masters();
  float* v = t.update_begin(1);
  for (int64_t i = 4096; i < 8192; ++i) v[i] += delta;
  t.update_end(1, 42);
  t.widen_masters();
  for (int64_t i = 4096; i < 8192; ++i) ASSERT_EQ(std::as_const(t).param_data()[i], after[i]) << i;
}

// A checkpoint's streaming read: any range, across given-back masters and fp32 ones, reads what
// widening them would give, and leaves the masters given back.
TEST(ParamStoreBf16Masters, ReadsWeightsWidenedWithoutWideningThem) {
  std::unique_ptr<ParamStore> sp = bf16_store();
  ParamStore& s = *sp;
  float* p = s.param_data();
  for (int64_t i = 0; i < 8192; ++i) p[i] = 1.0f + static_cast<float>(i) * 1e-5f;
  s.release_masters();
  std::vector<float> read(8192);
  for (const auto& [b, n] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 8192}, {4000, 200}, {5000, 10}, {7100, 1000}, {0, 4096}}) {
    s.read_weights(b, n, read.data() + b);
    EXPECT_EQ(s.weights_in_place(b, n), b + n <= 4096 || b >= 7168) << b << " " << n;
  }
  ASSERT_TRUE(s.masters_released());
  s.widen_masters();
  for (int64_t i = 0; i < 8192; ++i)
    ASSERT_EQ(read[static_cast<size_t>(i)], std::as_const(s).param_data()[i]) << i;
  EXPECT_EQ(read[4096], round_to_bf16(1.0f + 4096 * 1e-5f));  // through the bf16 copy
  EXPECT_EQ(read[8000], 1.0f + 8000 * 1e-5f);                 // an fp32 master
}

TEST(ParamStoreBf16Masters, NeedsATrainableStoreWithACopy) {
  ParamStore::Layout lay{16, {{0, 16}}, 0, {}};
  EXPECT_NE(titan::testing::error_of([&] {
              ParamStore s(lay, ParamStore::Options{false, true, false, true},
                           ops::backend("cpu", "float32"));
            }).find("bf16 master weights need"),
            std::string::npos);
}

}  // namespace
}  // namespace titan::models
