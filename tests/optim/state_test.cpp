// AdamW's state in 8 bits (optimizer.state_dtype int8), against the real bitsandbytes AdamW8bit
// (tests/fixtures/adamw8bit, made by tools/make_adamw8bit_fixtures.py with bitsandbytes' CPU
// backend), and its blocks, ranges and checkpoint round trip.
#include "titan/optim/state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/optim/adamw_math.h"

namespace titan::optim {
namespace {

const std::string kFixture = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/adamw8bit/";

std::vector<float> f32(const ckpt::SafetensorsSet& s, const std::string& name) {
  const ckpt::TensorView* t = s.find(name);
  EXPECT_NE(t, nullptr) << name;
  std::vector<float> out(static_cast<size_t>(t->numel()));
  s.read_f32(name, t->shape, out.data());
  return out;
}

std::vector<uint8_t> u8(const ckpt::SafetensorsSet& s, const std::string& name) {
  const ckpt::TensorView* t = s.find(name);
  EXPECT_NE(t, nullptr) << name;
  EXPECT_EQ(t->dtype, DType::U8) << name;
  return {t->data, t->data + t->nbytes};
}

std::vector<float> random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) e = d(gen);
  return x;
}

// The maps are bitsandbytes' create_dynamic_map(signed=True/False), bit for bit.
TEST(AdamW8bit, MapsAreBitsandbytesDynamicMaps) {
  const auto s = ckpt::SafetensorsSet::open(kFixture + "steps.safetensors");
  for (const bool is_signed : {true, false}) {
    const std::vector<float> want = f32(s, is_signed ? "qmap1" : "qmap2");
    ASSERT_EQ(want.size(), 256u);
    EXPECT_EQ(std::memcmp(want.data(), q8_map(is_signed), 256 * sizeof(float)), 0) << is_signed;
  }
}

// Each of six steps of bitsandbytes' AdamW8bit, taken by titan from bitsandbytes' own state and
// parameters before it, on the same gradient. The update reads the same decoded moments, so the
// parameters agree to float rounding (1e-6 relative). The new scales are each block's largest
// magnitude (1e-6 relative). The codes: titan encodes to the nearest map entry, as
// bitsandbytes' CUDA kernels do; its CPU backend first rounds x/absmax to one of 65,536 bins of
// width 2/65535, so the two entries differ by at most one bin plus the map's spacing there
// (where entries lie closer than a bin, near 0, they may be several indices apart).
TEST(AdamW8bit, EachStepMatchesBitsandbytesAdamW8bitFromItsState) {
  const auto s = ckpt::SafetensorsSet::open(kFixture + "steps.safetensors");
  const AdamWConfig c{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  constexpr float kBin = 2.0f / 65535.0f;
  for (int pi = 0; pi < 2; ++pi) {
    const std::string pre = "p" + std::to_string(pi) + ".";
    std::vector<float> p = f32(s, pre + "init");
    const auto n = static_cast<int64_t>(p.size());
    const auto nb = static_cast<size_t>((n + kQ8Block - 1) / kQ8Block);
    AdamWState st(DType::I8, n, DeviceMemory{}, {0});
    int64_t same = 0;
    for (int64_t t = 1; t <= 6; ++t) {
      const std::string ts = std::to_string(t);
      const std::vector<float> g = f32(s, pre + "grad." + ts);
      st.step(kernels("cpu"), p.data(), g.data(), c, c.lr, t, 0);
      const std::vector<float> want_p = f32(s, pre + "param." + ts);
      float worst = 0;
      for (size_t j = 0; j < p.size(); ++j)
        worst =
            std::max(worst, std::fabs(p[j] - want_p[j]) / std::max(std::fabs(want_p[j]), 1e-2f));
      EXPECT_LE(worst, 1e-6f) << pre << "param step " << t;
      for (const bool first : {true, false}) {
        const std::string at = pre + (first ? "m" : "v") + " step " + ts;
        const std::string i = first ? "1." : "2.";
        const std::vector<uint8_t> wq = u8(s, pre + "state" + i + ts);
        const std::vector<float> wa = f32(s, pre + "absmax" + i + ts);
        ASSERT_EQ(wq.size(), static_cast<size_t>(n));
        ASSERT_EQ(wa.size(), nb);
        auto* q = static_cast<uint8_t*>(first ? st.m() : st.v());
        const float* map = q8_map(first);
        float worst_scale = 0, worst_code = 0;
        for (size_t b = 0; b < nb; ++b)
          worst_scale = std::max(worst_scale, std::fabs(st.absmax(first)[b] - wa[b]) / wa[b]);
        for (int64_t j = 0; j < n; ++j) {
          const int k = q[j], w = wq[static_cast<size_t>(j)];
          const float gap =
              std::max(k > 0 ? map[k] - map[k - 1] : 0.0f, k < 255 ? map[k + 1] - map[k] : 0.0f);
          worst_code = std::max(worst_code, std::fabs(map[k] - map[w]) / (gap + kBin));
          same += k == w;
        }
        EXPECT_LE(worst_scale, 1e-6f) << at;
        EXPECT_LE(worst_code, 1.0f) << at;
        // go on from bitsandbytes' state
        std::memcpy(q, wq.data(), wq.size());
        std::memcpy(st.absmax(first), wa.data(), nb * sizeof(float));
      }
      p = want_p;
    }
    EXPECT_GE(static_cast<double>(same) / static_cast<double>(12 * n), 0.99) << pre;
  }
}

// Blocks start at each parameter and every 256 elements after; a range that cuts a block is
// refused; updating parameter by parameter (step_range) gives the bits of one step().
TEST(AdamW8bit, BlocksStartAtParametersAndRangesGiveTheWholeStepsBits) {
  const int64_t n = 1000;
  const std::vector<int64_t> starts{0, 300, 301, 812};
  const auto p0 = random(n, 1, 0.5f), g = random(n, 2, 0.1f);
  const AdamWConfig c;
  AdamWState whole(DType::I8, n, DeviceMemory{}, starts),
      parts(DType::I8, n, DeviceMemory{}, starts);
  auto pw = p0, pp = p0;
  const Kernels& k = kernels("cpu");
  for (int64_t t = 1; t <= 3; ++t) {
    whole.step(k, pw.data(), g.data(), c, 1e-3f, t, 0);
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t end = i + 1 < starts.size() ? starts[i + 1] : n;
      parts.step_range(k, pp.data(), g.data(), starts[i], end - starts[i], c, 1e-3f, t, 0);
    }
  }
  EXPECT_EQ(pw, pp);
  EXPECT_EQ(std::memcmp(whole.m(), parts.m(), n), 0);
  EXPECT_EQ(std::memcmp(whole.v(), parts.v(), n), 0);
  // the element 300 is its own block: its scale is its own magnitude, its code the map's end
  std::vector<float> one(1);
  whole.decode(false, 300, 1, one.data());
  EXPECT_GT(one[0], 0.0f);
  EXPECT_EQ(static_cast<const uint8_t*>(whole.v())[300], 255);
  EXPECT_THROW(whole.step_range(k, pw.data(), g.data(), 0, 100, c, 1e-3f, 4, 0), Error);
  EXPECT_THROW(whole.decode(true, 556, 44, one.data()), Error);
  EXPECT_NO_THROW(whole.step_range(k, pw.data(), g.data(), 557, 255, c, 1e-3f, 4, 0));
}

// What decode gives (a checkpoint's F32 moments) encodes back to the same codes and scales, bit
// for bit, also for blocks whose largest magnitude is negative (code 0, the map's end -0.993).
TEST(AdamW8bit, DecodeThenEncodeRestoresTheStateBitwise) {
  const int64_t n = 5 * kQ8Block + 17;
  auto p = random(n, 3, 0.5f);
  AdamWState st(DType::I8, n, DeviceMemory{}, {0, 700});
  for (int64_t t = 1; t <= 4; ++t) {
    const auto g = random(n, 10 + static_cast<uint32_t>(t), 0.2f / static_cast<float>(t));
    st.step(kernels("cpu"), p.data(), g.data(), AdamWConfig{}, 1e-3f, t, 0);
  }
  std::vector<float> m(static_cast<size_t>(n)), v(m.size());
  st.decode(true, 0, n, m.data());
  st.decode(false, 0, n, v.data());
  int negative_ends = 0;
  for (int64_t j = 0; j < n; ++j) negative_ends += static_cast<const uint8_t*>(st.m())[j] == 0;
  EXPECT_GT(negative_ends, 0);
  AdamWState back(DType::I8, n, DeviceMemory{}, {0, 700});
  back.encode(true, 0, 700, m.data());
  back.encode(true, 700, n - 700, m.data() + 700);
  back.encode(false, 0, n, v.data());
  EXPECT_EQ(std::memcmp(st.m(), back.m(), n), 0);
  EXPECT_EQ(std::memcmp(st.v(), back.v(), n), 0);
  std::vector<float> m2(m.size()), v2(m.size());
  back.decode(true, 0, n, m2.data());
  back.decode(false, 0, n, v2.data());
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

// The CPU kernel's table encoder gives the bisection's index for every float in [-1.5, 1.5] of
// the form k / 2^20 and for ±0, the map entries and their midpoints' neighbours.
TEST(AdamW8bit, TableEncoderIsTheBisection) {
  for (const bool is_signed : {true, false}) {
    const float* map = q8_map(is_signed);
    std::vector<float> xs{0.0f, -0.0f, 1.0f, -1.0f};
    for (int k = -(3 << 19); k <= (3 << 19); ++k) xs.push_back(static_cast<float>(k) / (1 << 20));
    for (int i = 0; i < 256; ++i) {
      xs.push_back(map[i]);
      if (i < 255) {
        const float mid = (map[i] + map[i + 1]) / 2;
        xs.insert(xs.end(), {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)});
      }
    }
    int64_t differ = 0;
    for (const float x : xs) differ += q8_encode_fast(x, is_signed) != q8_encode(x, map);
    EXPECT_EQ(differ, 0) << (is_signed ? "signed" : "unsigned");
  }
}

// The name int8 reads as the 8-bit state; other names are refused naming the field.
TEST(AdamW8bit, StateDtypeNames) {
  EXPECT_EQ(state_dtype("int8"), DType::I8);
  EXPECT_THROW(state_dtype("uint8"), Error);
}

}  // namespace
}  // namespace titan::optim
