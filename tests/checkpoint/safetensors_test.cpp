// safetensors: round trips, the header layout, F16/BF16 rounding against exact references,
// sharded exports, and one hand-built corrupt file or index per validation rule.
#include "titan/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "titan/core/error.h"

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("titan_st_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// [u64 little-endian n][header][data], n = header size unless given.
std::string raw_file(const std::string& header, const std::string& data = "",
                     uint64_t n = std::numeric_limits<uint64_t>::max(), bool use_n = false) {
  const uint64_t len = use_n ? n : header.size();
  std::string r(8, '\0');
  for (int i = 0; i < 8; ++i) r[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  return r + header + data;
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> r;
  for (const auto& e : fs::directory_iterator(dir)) r.insert(e.path().filename().string());
  return r;
}

// Expects fn to throw titan::Error mentioning each of parts.
template <typename F>
void expect_error(F&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no titan::Error thrown (expected one mentioning '" << parts.at(0) << "')";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << "\nlacks: " << p;
  }
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to16(DType dt, float f) {
  uint16_t h;
  f32_to(dt, &f, 1, &h);
  return h;
}
float from16(DType dt, uint16_t h) {
  float f;
  to_f32(dt, &h, 1, &f);
  return f;
}

// Exact round-to-nearest-even of x to a binary format with `mant` stored mantissa bits, minimum
// normal exponent emin and overflow threshold 2^(emax+1), computed in double (exact here).
float reference_round(float x, int mant, int emin, int emax) {
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0) return x;
  const int e = std::max(std::ilogb(a), emin);
  const double step = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(a / step) * step;  // default rounding mode: ties to even
  const double inf = std::numeric_limits<double>::infinity();
  const double v = r >= std::ldexp(1.0, emax + 1) ? inf : r;
  return static_cast<float>(std::copysign(v, static_cast<double>(x)));
}

// ---- dtypes and conversions

TEST(SafetensorsDType, NamesSizesAndParse) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::BOOL, 1}, {DType::U8, 1},      {DType::I8, 1},     {DType::I16, 2},
      {DType::U16, 2},  {DType::F16, 2},     {DType::BF16, 2},   {DType::I32, 4},
      {DType::U32, 4},  {DType::F32, 4},     {DType::F64, 8},    {DType::I64, 8},
      {DType::U64, 8},  {DType::F8_E4M3, 1}, {DType::F8_E5M2, 1}};
  for (const auto& [dt, size] : all) {
    EXPECT_EQ(dtype_size(dt), size) << dtype_name(dt);
    EXPECT_EQ(parse_dtype(dtype_name(dt)), dt);
  }
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_STREQ(dtype_name(DType::F8_E4M3), "F8_E4M3");
  expect_error([] { parse_dtype("bf16"); }, {"'bf16'"});
  expect_error([] { parse_dtype("F4"); }, {"'F4'"});
}

TEST(SafetensorsConvert, Bf16KnownBitPatterns) {
  const DType B = DType::BF16;
  EXPECT_EQ(to16(B, 1.0f), 0x3F80);
  EXPECT_EQ(to16(B, -2.0f), 0xC000);
  EXPECT_EQ(to16(B, 0.0f), 0x0000);
  EXPECT_EQ(to16(B, -0.0f), 0x8000);
  // Ties go to the even neighbour; anything past the tie goes up.
  EXPECT_EQ(to16(B, from_bits(0x3F808000)), 0x3F80);
  EXPECT_EQ(to16(B, from_bits(0x3F818000)), 0x3F82);
  EXPECT_EQ(to16(B, from_bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(to16(B, from_bits(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(to16(B, from_bits(0xBF818000)), 0xBF82);
  // Rounding carries into the exponent, and the largest float rounds to inf.
  EXPECT_EQ(to16(B, from_bits(0x3FFFFFFF)), 0x4000);
  EXPECT_EQ(to16(B, std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(to16(B, std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(to16(B, -std::numeric_limits<float>::infinity()), 0xFF80);
  // NaN stays NaN, even one whose payload sits only in the low bits (plain rounding gives inf).
  EXPECT_EQ(to16(B, std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(to16(B, from_bits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(to16(B, from_bits(0xFFC00000)), 0xFFC0);
  EXPECT_TRUE(std::isnan(from16(B, 0x7FC0)));
  // Subnormal floats round like any other.
  EXPECT_EQ(to16(B, from_bits(0x00010000)), 0x0001);
  EXPECT_EQ(to16(B, from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(from16(B, 0x3F80), 1.0f);
  EXPECT_EQ(bits(from16(B, 0xC049)), 0xC0490000u);
}

TEST(SafetensorsConvert, F16KnownBitPatterns) {
  const DType H = DType::F16;
  EXPECT_EQ(to16(H, 1.0f), 0x3C00);
  EXPECT_EQ(to16(H, -2.0f), 0xC000);
  EXPECT_EQ(to16(H, 0.1f), 0x2E66);
  EXPECT_EQ(to16(H, -0.0f), 0x8000);
  EXPECT_EQ(to16(H, 65504.0f), 0x7BFF);  // max half
  EXPECT_EQ(to16(H, 65519.0f), 0x7BFF);
  EXPECT_EQ(to16(H, 65520.0f), 0x7C00);  // the tie above max goes to inf (even)
  EXPECT_EQ(to16(H, 1e6f), 0x7C00);
  EXPECT_EQ(to16(H, -1e6f), 0xFC00);
  EXPECT_EQ(to16(H, -std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(to16(H, 1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even
  EXPECT_EQ(to16(H, 1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even
  EXPECT_EQ(to16(H, std::ldexp(1.0f, -14)), 0x0400);             // smallest normal
  EXPECT_EQ(to16(H, std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(to16(H, 1023 * std::ldexp(1.0f, -24)), 0x03FF);      // largest subnormal
  EXPECT_EQ(to16(H, 1023.5f * std::ldexp(1.0f, -24)), 0x0400);   // rounds up into the normals
  EXPECT_EQ(to16(H, std::ldexp(1.0f, -25)), 0x0000);             // tie between 0 and 1 -> 0
  EXPECT_EQ(to16(H, -std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(to16(H, 1.5f * std::ldexp(1.0f, -25)), 0x0001);
  EXPECT_EQ(to16(H, 3 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 1 and 2 -> 2
  EXPECT_EQ(to16(H, 5 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 2 and 3 -> 2
  EXPECT_EQ(to16(H, std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(to16(H, std::numeric_limits<float>::denorm_min()), 0x0000);
  const uint16_t nan = to16(H, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  EXPECT_NE(to16(H, from_bits(0x7F800001)) & 0x03FF, 0);  // payload only in the low bits
  EXPECT_EQ(from16(H, 0x7BFF), 65504.0f);
  EXPECT_EQ(from16(H, 0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(from16(H, 0x8400), -std::ldexp(1.0f, -14));
  EXPECT_EQ(from16(H, 0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(from16(H, 0x7E00)));
}

TEST(SafetensorsConvert, AllSixteenBitPatternsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto u = static_cast<uint16_t>(h);
    const bool f16_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    const bool bf16_nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    // NaN comes back quiet (the top mantissa bit set), everything else bit-exact.
    ASSERT_EQ(to16(DType::F16, from16(DType::F16, u)), f16_nan ? (u | 0x0200) : u) << h;
    ASSERT_EQ(to16(DType::BF16, from16(DType::BF16, u)), bf16_nan ? (u | 0x0040) : u) << h;
  }
}

TEST(SafetensorsConvert, RoundingMatchesExactReference) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int i = 0; i < 400000; ++i) {
    const float f = from_bits(static_cast<uint32_t>(rng()));
    if (std::isfinite(f)) xs.push_back(f);
  }
  // Dense around the F16 range, subnormals and the overflow edge, where most rules bite.
  std::uniform_real_distribution<float> e16(-27.0f, 17.0f);
  for (int i = 0; i < 400000; ++i) {
    const float f = std::exp2(e16(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
    xs.push_back(from_bits(bits(f) ^ (rng() & 0x3)));
  }
  std::vector<uint16_t> h(xs.size()), b(xs.size());
  f32_to(DType::F16, xs.data(), static_cast<int64_t>(xs.size()), h.data());
  f32_to(DType::BF16, xs.data(), static_cast<int64_t>(xs.size()), b.data());
  std::vector<float> hf(xs.size()), bf(xs.size());
  to_f32(DType::F16, h.data(), static_cast<int64_t>(xs.size()), hf.data());
  to_f32(DType::BF16, b.data(), static_cast<int64_t>(xs.size()), bf.data());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(bits(hf[i]), bits(reference_round(xs[i], 10, -14, 15))) << "F16 of " << xs[i];
    ASSERT_EQ(bits(bf[i]), bits(reference_round(xs[i], 7, -126, 127))) << "BF16 of " << xs[i];
  }
}

TEST(SafetensorsConvert, RejectsOtherDtypes) {
  float f = 1.0f;
  int32_t i = 0;
  expect_error([&] { f32_to(DType::I32, &f, 1, &i); }, {"I32"});
  expect_error([&] { to_f32(DType::U8, &i, 1, &f); }, {"U8"});
}

// ---- single files

TEST(SafetensorsRoundTrip, AllDtypesScalarAndZeroSized) {
  TempDir dir;
  const std::string path = dir / "rt.safetensors";
  const std::vector<float> w = {1.0f, -2.0f, 3.5f, 0.25f, 1e-3f, -7.0f};
  const std::vector<float> bvals = {1.0f, -2.0f, 0.5f, 3.0f, 0.1f};  // 0.1 rounds in bf16
  std::vector<uint16_t> b(bvals.size()), h(3);
  f32_to(DType::BF16, bvals.data(), 5, b.data());
  const std::vector<float> hvals = {1.0f, 0.5f, -65504.0f};
  f32_to(DType::F16, hvals.data(), 3, h.data());
  const std::vector<double> dvals = {0.5, -1.25};
  const float scalar = 42.0f;
  const std::vector<int32_t> ints = {7, -8};
  const std::vector<uint8_t> bytes = {1, 2, 3};
  write_file(path,
             {{"w", DType::F32, {2, 3}, w.data()},
              {"b", DType::BF16, {5}, b.data()},
              {"h", DType::F16, {3, 1}, h.data()},
              {"d", DType::F64, {2}, dvals.data()},
              {"scalar", DType::F32, {}, &scalar},
              {"empty", DType::F32, {0, 5}, nullptr},
              {"empty_bf16", DType::BF16, {3, 0}, nullptr},
              {"ints", DType::I32, {2}, ints.data()},
              {"bytes", DType::U8, {3}, bytes.data()}},
             {{"step", "12"}});

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "bytes", "d", "empty", "empty_bf16", "h", "ints",
                                             "scalar", "w"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "12");

  const TensorView* tw = f.find("w");
  ASSERT_NE(tw, nullptr);
  EXPECT_EQ(tw->dtype, DType::F32);
  EXPECT_EQ(tw->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(tw->numel(), 6);
  EXPECT_EQ(tw->nbytes, 24u);
  EXPECT_EQ(std::memcmp(tw->data, w.data(), 24), 0);
  const TensorView* tb = f.find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 10), 0);
  const TensorView* ts = f.find("scalar");
  ASSERT_NE(ts, nullptr);
  EXPECT_TRUE(ts->shape.empty());
  EXPECT_EQ(ts->numel(), 1);
  const TensorView* te = f.find("empty_bf16");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->numel(), 0);
  EXPECT_EQ(te->nbytes, 0u);
  EXPECT_EQ(te->dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(f.find("ints")->data, ints.data(), 8), 0);
  EXPECT_EQ(f.find("bytes")->dtype, DType::U8);
  EXPECT_EQ(f.find("nope"), nullptr);

  SafetensorsSet s = SafetensorsSet::open(path);
  EXPECT_EQ(s.names(), names);
  EXPECT_EQ(s.total_bytes(), 24 + 10 + 6 + 16 + 4 + 8 + 3);
  std::vector<float> out(6);
  s.read_f32("w", {2, 3}, out.data());
  EXPECT_EQ(out, w);
  out.assign(5, 0.0f);
  s.read_f32("b", {5}, out.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], from16(DType::BF16, b[i]));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_NE(out[4], 0.1f);  // bf16 rounding happened
  out.assign(3, 0.0f);
  s.read_f32("h", {3, 1}, out.data());
  EXPECT_EQ(out, hvals);
  out.assign(2, 0.0f);
  s.read_f32("d", {2}, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.25f}));
  float sc = 0;
  s.read_f32("scalar", {}, &sc);
  EXPECT_EQ(sc, 42.0f);
  float unused = 0;
  s.read_f32("empty", {0, 5}, &unused);
  s.read_f32("empty_bf16", {3, 0}, &unused);
}

TEST(SafetensorsRoundTrip, HeaderIsAlignedCompactAndTaggedPt) {
  TempDir dir;
  for (int len = 1; len <= 9; ++len) {  // names of every length shift the header size
    const std::string path = dir / (std::to_string(len) + ".safetensors");
    const float v = 1.0f;
    write_file(path, {{std::string(len, 'x'), DType::F32, {}, &v}});
    const std::string raw = read_all(path);
    ASSERT_GE(raw.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
    EXPECT_EQ((8 + n) % 8, 0u) << path;
    EXPECT_EQ(raw.size(), 8 + n + 4);
    const std::string header = raw.substr(8, n);
    EXPECT_EQ(header[0], '{');
    EXPECT_NE(header.find(R"("__metadata__":{"format":"pt"})"), std::string::npos) << header;
    const size_t close = header.find_last_of('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "pads with spaces";
    EXPECT_EQ(header.find('\n'), std::string::npos);
  }
}

TEST(SafetensorsRoundTrip, GivenFormatKeptAndNoTensorsValid) {
  TempDir dir;
  write_file(dir / "np.safetensors", {}, {{"format", "np"}});
  SafetensorsFile f = SafetensorsFile::open(dir / "np.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "np");
  EXPECT_TRUE(f.tensors().empty());
  SafetensorsSet s = SafetensorsSet::open(dir / "np.safetensors");
  EXPECT_TRUE(s.names().empty());
  EXPECT_EQ(s.total_bytes(), 0);
  // By hand: "{}" with no data section at all.
  write_bytes(dir / "bare.safetensors", raw_file("{}"));
  EXPECT_TRUE(SafetensorsFile::open(dir / "bare.safetensors").tensors().empty());
}

TEST(SafetensorsRead, TrailingWhitespaceAndUnalignedData) {
  TempDir dir;
  // A header whose length puts the data at an odd address, padded with mixed whitespace.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("__metadata__":{"k":"v"}})";
  header += " \n\t";
  while ((8 + header.size()) % 2 == 0) header += ' ';
  write_bytes(dir / "odd.safetensors", raw_file(header, float_bytes({1.5f, -3.0f})));
  SafetensorsSet s = SafetensorsSet::open(dir / "odd.safetensors");
  std::vector<float> out(2);
  s.read_f32("w", {2}, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(s.files().at(0).metadata().at("k"), "v");
}

// A tensor given by fill is asked for in slices of at most 64 MiB, in order, whole elements each:
// a 17 Mi-element fp32 tensor (68 MiB) in two, beside a bf16 one in one.
TEST(SafetensorsWrite, FilledTensorsComeSliceBySlice) {
  TempDir dir;
  const int64_t n = 17 << 20;
  std::vector<std::pair<int64_t, int64_t>> asked;
  auto fill = [&](int64_t first, int64_t count, void* dst) {
    asked.emplace_back(first, count);
    for (int64_t i = 0; i < count; ++i) static_cast<float*>(dst)[i] = static_cast<float>(first + i);
  };
  auto fill16 = [](int64_t first, int64_t count, void* dst) {
    for (int64_t i = 0; i < count; ++i)
      static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(0x3f80 + first + i);  // 1, 1+2^-7
  };
  write_file(dir / "f.safetensors", {{"big", DType::F32, {n}, nullptr, fill},
                                     {"small", DType::BF16, {2}, nullptr, fill16}});
  EXPECT_EQ(asked, (std::vector<std::pair<int64_t, int64_t>>{{0, 16 << 20}, {16 << 20, 1 << 20}}));
  SafetensorsSet f = SafetensorsSet::open(dir / "f.safetensors");
  std::vector<float> big(static_cast<size_t>(n));
  f.read_f32("big", {n}, big.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(big[static_cast<size_t>(i)], static_cast<float>(i));
  std::vector<float> small(2);
  f.read_f32("small", {2}, small.data());
  EXPECT_EQ(small, (std::vector<float>{1.0f, 1.0f + 1.0f / 128}));
}

TEST(SafetensorsRead, MovedFileKeepsItsViews) {
  TempDir dir;
  const std::vector<float> v = {1, 2, 3};
  write_file(dir / "m.safetensors", {{"v", DType::F32, {3}, v.data()}});
  SafetensorsFile a = SafetensorsFile::open(dir / "m.safetensors");
  const TensorView* t = a.find("v");
  SafetensorsFile b = std::move(a);
  std::vector<SafetensorsFile> files;
  files.push_back(std::move(b));
  files.push_back(SafetensorsFile::open(dir / "m.safetensors"));
  EXPECT_EQ(files[0].find("v"), t);
  EXPECT_EQ(std::memcmp(t->data, v.data(), 12), 0);
}

TEST(SafetensorsRead, ReadF32ErrorsNameFileAndTensor) {
  TempDir dir;
  const std::string path = dir / "e.safetensors";
  const std::vector<int32_t> ids = {1, 2};
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  write_file(path, {{"ids", DType::I32, {2}, ids.data()}, {"w", DType::F32, {2, 3}, w.data()}});
  SafetensorsSet s = SafetensorsSet::open(path);
  std::vector<float> out(6);
  expect_error([&] { s.read_f32("missing", {1}, out.data()); }, {path, "'missing'"});
  expect_error([&] { s.read_f32("w", {3, 2}, out.data()); }, {path, "'w'", "[2, 3]", "[3, 2]"});
  expect_error([&] { s.read_f32("ids", {2}, out.data()); }, {path, "'ids'", "I32"});
  EXPECT_EQ(s.file_of("w"), path);
  EXPECT_EQ(s.file_of("missing"), "");
}

// Each corrupt file by hand; the error must name the file and, where there is one, the tensor.
TEST(SafetensorsBadFile, EachRuleRejectedWithFileAndTensorNamed) {
  TempDir dir;
  const std::string f4 = float_bytes({1.0f});
  const std::string f8 = float_bytes({1.0f, 2.0f});
  const std::string f12 = float_bytes({1.0f, 2.0f, 3.0f});
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offs) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offs + "}";
  };
  struct Case {
    std::string label, bytes;
    std::vector<std::string> parts;  // besides the file name
  };
  const std::vector<Case> cases = {
      {"empty_file", "", {"too short"}},
      {"seven_bytes", std::string(7, '\0'), {"too short"}},
      {"len_past_end", raw_file("{}", "", 1000, true), {"1000"}},
      {"len_above_limit", raw_file("{}", "", 100000001, true), {"100000000"}},
      {"len_max_u64", raw_file("{}", "", std::numeric_limits<uint64_t>::max(), true), {"header"}},
      {"zero_len_header", raw_file(""), {"'{'"}},
      {"not_json", raw_file(R"({"w": )"), {"JSON"}},
      {"json_array", raw_file("[1, 2]"), {"'{'"}},
      {"leading_space", raw_file(" {}"), {"'{'"}},
      {"invalid_utf8", raw_file("{\"\xff\":1}"), {"JSON"}},
      {"entry_not_object", raw_file(R"({"w":5})"), {"'w'", "object"}},
      {"missing_dtype",
       raw_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", f4),
       {"'w'", "dtype"}},
      {"missing_shape",
       raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", f4),
       {"'w'", "shape"}},
      {"missing_offsets",
       raw_file(R"({"w":{"dtype":"F32","shape":[1]}})", f4),
       {"'w'", "data_offsets"}},
      {"dtype_not_string",
       raw_file(R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", f4),
       {"'w'", "dtype"}},
      {"shape_not_array",
       raw_file(R"({"w":)" + entry("F32", "\"x\"", "[0,4]") + "}", f4),
       {"'w'", "shape"}},
      {"shape_float",
       raw_file(R"({"w":)" + entry("F32", "[1.0]", "[0,4]") + "}", f4),
       {"'w'", "shape"}},
      {"shape_string_dim",
       raw_file(R"({"w":)" + entry("F32", "[\"1\"]", "[0,4]") + "}", f4),
       {"'w'", "shape"}},
      {"offsets_one",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[0]") + "}", f4),
       {"'w'", "data_offsets"}},
      {"offsets_three",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[0,4,4]") + "}", f4),
       {"'w'", "data_offsets"}},
      {"offsets_string",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[0,\"4\"]") + "}", f4),
       {"'w'", "data_offsets"}},
      {"offsets_negative",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[-4,0]") + "}", f4),
       {"'w'", "data_offsets"}},
      {"offsets_not_array",
       raw_file(R"({"w":)" + entry("F32", "[1]", "{}") + "}", f4),
       {"'w'", "data_offsets"}},
      {"unknown_dtype",
       raw_file(R"({"w":)" + entry("Q8", "[1]", "[0,1]") + "}", f4),
       {"'w'", "'Q8'"}},
      {"lowercase_dtype",
       raw_file(R"({"w":)" + entry("f32", "[1]", "[0,4]") + "}", f4),
       {"'w'", "'f32'"}},
      {"negative_dim",
       raw_file(R"({"w":)" + entry("F32", "[-1,2]", "[0,4]") + "}", f4),
       {"'w'", "negative"}},
      {"huge_dim",
       raw_file(R"({"w":)" + entry("U8", "[18446744073709551615]", "[0,4]") + "}", f4),
       {"'w'", "18446744073709551615"}},
      {"size_mismatch",
       raw_file(R"({"w":)" + entry("F32", "[2]", "[0,4]") + "}", f8),
       {"'w'", "needs 8 bytes"}},
      {"numel_overflow",
       raw_file(R"({"w":)" + entry("F32", "[4294967296,4294967296]", "[0,4]") + "}", f4),
       {"'w'", "overflow"}},
      {"bytes_overflow",
       raw_file(R"({"w":)" + entry("F32", "[4611686018427387904]", "[0,4]") + "}", f4),
       {"'w'", "overflow"}},
      {"begin_after_end",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[8,4]") + "}", f12),
       {"'w'", "begin > end"}},
      {"end_past_data",
       raw_file(R"({"w":)" + entry("F32", "[2]", "[0,8]") + "}", f4),
       {"'w'", "past the data section"}},
      {"end_far_past_data",
       raw_file(
           R"({"w":)" + entry("F32", "[1]", "[18446744073709551612,18446744073709551615]") + "}",
           f4),
       {"'w'"}},
      {"overlap",
       raw_file(R"({"a":)" + entry("F32", "[2]", "[0,8]") + R"(,"b":)" +
                    entry("F32", "[2]", "[4,12]") + "}",
                f12),
       {"'a'", "'b'", "overlap"}},
      {"same_range",
       raw_file(R"({"a":)" + entry("F32", "[1]", "[0,4]") + R"(,"b":)" +
                    entry("I32", "[1]", "[0,4]") + "}",
                f4),
       {"'a'", "'b'", "overlap"}},
      {"empty_inside_other",
       raw_file(R"({"a":)" + entry("F32", "[2]", "[0,8]") + R"(,"z":)" +
                    entry("F32", "[0]", "[4,4]") + "}",
                f8),
       {"'a'", "'z'", "overlap"}},
      {"duplicate_name",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[0,4]") + R"(,"w":)" +
                    entry("F32", "[1]", "[4,8]") + "}",
                f8),
       {"'w'", "more than once"}},
      {"duplicate_field",
       raw_file(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", f4),
       {"'w'", "dtype", "more than once"}},
      {"metadata_string", raw_file(R"({"__metadata__":"x"})"), {"__metadata__"}},
      {"metadata_array", raw_file(R"({"__metadata__":["a","b"]})"), {"__metadata__"}},
      {"metadata_number_value",
       raw_file(R"({"__metadata__":{"epoch":1}})"),
       {"__metadata__", "'epoch'"}},
      {"metadata_nested", raw_file(R"({"__metadata__":{"a":{"b":"c"}}})"), {"__metadata__", "'a'"}},
      // The reference reader's Metadata::validate: the tensors tile the data section exactly.
      {"trailing_bytes",
       raw_file(R"({"w":)" + entry("F32", "[1]", "[0,4]") + "}", f8),
       {"4 trailing byte(s)", "the tensors end at 4"}},
      {"trailing_bytes_no_tensors", raw_file("{}", f4), {"4 trailing byte(s)"}},
      {"gap_between",
       raw_file(R"({"a":)" + entry("F32", "[1]", "[0,4]") + R"(,"b":)" +
                    entry("F32", "[1]", "[8,12]") + "}",
                f12),
       {"'b'", "starts at data byte 8", "ends at byte 4", "gap"}},
      {"gap_first",
       raw_file(R"({"a":)" + entry("F32", "[1]", "[4,8]") + "}", f8),
       {"'a'", "starts at data byte 4", "gap"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir / (c.label + ".safetensors");
    write_bytes(path, c.bytes);
    auto parts = c.parts;
    parts.insert(parts.begin(), path);
    expect_error([&] { SafetensorsFile::open(path); }, parts);
    expect_error([&] { SafetensorsSet::open(path); }, parts);
  }
  expect_error([&] { SafetensorsFile::open(dir / "absent.safetensors"); }, {"absent.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path().string()); }, {dir.path().string()});
}

// ---- writing

TEST(SafetensorsWrite, RejectsBadTensors) {
  TempDir dir;
  const float v[2] = {1, 2};
  const std::string path = dir / "w.safetensors";
  expect_error(
      [&] {
        write_file(path, {{"a", DType::F32, {1}, v}, {"a", DType::F32, {1}, v}});
      },
      {path, "'a'", "more than once"});
  expect_error(
      [&] {
        write_file(path, {{"__metadata__", DType::F32, {1}, v}});
      },
      {path, "__metadata__"});
  expect_error([&] { write_file(path, {{"n", DType::F32, {-1}, v}}); }, {path, "'n'", "negative"});
  expect_error([&] { write_file(path, {{"z", DType::F32, {2}, nullptr}}); }, {path, "'z'"});
  expect_error([&] { write_file(path, {{"\xff", DType::F32, {1}, v}}); }, {path, "UTF-8"});
  expect_error([&] { write_model(dir / "m", {{"a", DType::F32, {1}, v}}, 0); }, {"max_shard"});
  EXPECT_TRUE(listing(dir.path()).empty()) << "nothing written, no temp file left";
}

TEST(SafetensorsWrite, FailedWriteLeavesNoTempFile) {
  TempDir dir;
  const float v[2] = {1, 2};
  const std::vector<WriteTensor> ts = {{"a", DType::F32, {2}, v}};
  // The directory does not exist, or a path component is a file.
  expect_error([&] { write_file(dir / "missing/x.safetensors", ts); }, {"missing/x.safetensors"});
  write_bytes(dir / "plain", "x");
  expect_error([&] { write_file(dir / "plain/x.safetensors", ts); }, {"plain/x.safetensors"});
  // The temp file is written, then the rename fails (the target is a non-empty directory).
  fs::create_directories(dir.path() / "x.safetensors" / "inside");
  expect_error([&] { write_file(dir / "x.safetensors", ts); }, {"x.safetensors", "cannot move"});
  EXPECT_EQ(listing(dir.path()), (std::set<std::string>{"plain", "x.safetensors"}));
  // A success leaves only the file.
  write_file(dir / "ok.safetensors", ts);
  EXPECT_EQ(listing(dir.path()),
            (std::set<std::string>{"ok.safetensors", "plain", "x.safetensors"}));
}

// `--eval.logits_out /dev/null` must not rename a file over the device: written through.
TEST(SafetensorsWrite, DeviceIsWrittenThroughNotReplaced) {
  TempDir dir;
  const std::string dev = dir / "null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "cannot make a device node here (needs root)";
  const float v[2] = {1, 2};
  write_file(dev, {{"a", DType::F32, {2}, v}});
  struct stat st;
  ASSERT_EQ(::stat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(listing(dir.path()), (std::set<std::string>{"null"}));
}

struct Model {
  std::vector<std::vector<float>> values;  // fp32 values, in the order of tensors
  std::vector<uint16_t> d_bf16;            // storage of the BF16 tensor "d"
  std::vector<WriteTensor> tensors;
};

// a[4] b[2] c[10] e[1] as F32 and d[4] as BF16: 16 + 8 + 40 + 8 + 4 = 76 bytes. Values offset by
// `base` so that two exports differ.
Model make_model(float base) {
  Model m;
  const std::vector<std::pair<std::string, int64_t>> spec = {
      {"c", 10}, {"a", 4}, {"e", 1}, {"b", 2}, {"d", 4}};
  for (const auto& [name, n] : spec) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i) + 0.5f * name[0];
    m.values.push_back(v);
  }
  m.d_bf16.resize(4);
  f32_to(DType::BF16, m.values[4].data(), 4, m.d_bf16.data());
  for (size_t i = 0; i < spec.size(); ++i) {
    const bool is_d = spec[i].first == "d";
    m.tensors.push_back({spec[i].first,
                         is_d ? DType::BF16 : DType::F32,
                         {spec[i].second},
                         is_d ? static_cast<const void*>(m.d_bf16.data()) : m.values[i].data()});
  }
  return m;
}

void expect_model(const SafetensorsSet& s, const Model& m) {
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(s.total_bytes(), 76);
  for (size_t i = 0; i < 5; ++i) {
    const auto& t = m.tensors[i];
    std::vector<float> out(static_cast<size_t>(t.shape[0]));
    s.read_f32(t.name, t.shape, out.data());
    std::vector<float> want = m.values[i];
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> b(want.size());
      f32_to(DType::BF16, want.data(), static_cast<int64_t>(want.size()), b.data());
      to_f32(DType::BF16, b.data(), static_cast<int64_t>(b.size()), want.data());
    }
    EXPECT_EQ(out, want) << t.name;
  }
}

TEST(SafetensorsShard, IndexAndShardsReadBack) {
  TempDir dir;
  const Model m = make_model(0);
  const std::string out = dir / "export";
  write_model(out, m.tensors, 24, {{"producer", "titan"}});
  // Greedy in name order with a 24-byte limit: [a b] [c] (above the limit, alone) [d e].
  EXPECT_EQ(
      listing(out),
      (std::set<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  const std::string text = read_all(out + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(text);
  EXPECT_EQ(text, index.dump(2) + "\n") << "indent 2, sorted keys, trailing newline";
  EXPECT_EQ(index["metadata"]["total_size"], 76);
  const nlohmann::json want_map = {{"a", "model-00001-of-00003.safetensors"},
                                   {"b", "model-00001-of-00003.safetensors"},
                                   {"c", "model-00002-of-00003.safetensors"},
                                   {"d", "model-00003-of-00003.safetensors"},
                                   {"e", "model-00003-of-00003.safetensors"}};
  EXPECT_EQ(index["weight_map"], want_map);

  SafetensorsSet s = SafetensorsSet::open(out);
  expect_model(s, m);
  EXPECT_EQ(s.files().size(), 3u);
  EXPECT_EQ(fs::path(s.file_of("c")).filename(), "model-00002-of-00003.safetensors");
  for (const auto& f : s.files()) {
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("producer"), "titan");
  }
  expect_model(SafetensorsSet::open(out + "/model.safetensors.index.json"), m);
  SafetensorsSet one = SafetensorsSet::open(out + "/model-00003-of-00003.safetensors");
  EXPECT_EQ(one.names(), (std::vector<std::string>{"d", "e"}));
}

TEST(SafetensorsShard, SingleFileWhenItFits) {
  TempDir dir;
  const Model m = make_model(1);
  write_model(dir / "x", m.tensors, 76);
  EXPECT_EQ(listing(dir / "x"), (std::set<std::string>{"model.safetensors"}));
  expect_model(SafetensorsSet::open(dir / "x"), m);
  // One tensor above the limit and nothing else: a single file too.
  const float big[8] = {};
  write_model(dir / "y", {{"big", DType::F32, {8}, big}}, 4);
  EXPECT_EQ(listing(dir / "y"), (std::set<std::string>{"model.safetensors"}));
}

TEST(SafetensorsShard, OverwriteLeavesAConsistentSet) {
  TempDir dir;
  const std::string out = dir / "export";
  fs::create_directories(out);
  write_bytes(out + "/notes.txt", "keep");
  write_bytes(out + "/model_ema.safetensors", "not ours");
  const auto keep = std::set<std::string>{"notes.txt", "model_ema.safetensors"};
  auto with = [&](std::set<std::string> s) {
    s.insert(keep.begin(), keep.end());
    return s;
  };

  const Model m1 = make_model(1), m2 = make_model(2), m3 = make_model(3);
  write_model(out, m1.tensors, 24);    // 3 shards
  write_model(out, m2.tensors, 1000);  // single file: the shards and the index go
  EXPECT_EQ(listing(out), with({"model.safetensors"}));
  expect_model(SafetensorsSet::open(out), m2);

  write_model(out, m3.tensors, 40);  // [a b] [c] [d e] -> 3 shards; model.safetensors goes
  write_model(out, m1.tensors, 64);  // [a b c] [d e] -> 2 shards; the of-00003 shards go
  EXPECT_EQ(listing(out),
            with({"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json"}));
  expect_model(SafetensorsSet::open(out), m1);

  write_model(out, m3.tensors, 64);  // same names, replaced in place
  EXPECT_EQ(listing(out),
            with({"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json"}));
  expect_model(SafetensorsSet::open(out), m3);
}

TEST(SafetensorsShard, FailedExportKeepsTheEarlierOne) {
  TempDir dir;
  const std::string out = dir / "export";
  const Model m1 = make_model(1), m2 = make_model(2);
  write_model(out, m1.tensors, 1000);
  // Block the index's temp file: the shards' temp files are written, then the index fails.
  const std::string blocker = out + "/model.safetensors.index.json.tmp-" + std::to_string(getpid());
  fs::create_directories(blocker);
  expect_error([&] { write_model(out, m2.tensors, 24); }, {"model.safetensors.index.json"});
  fs::remove(blocker);
  EXPECT_EQ(listing(out), (std::set<std::string>{"model.safetensors"}));
  expect_model(SafetensorsSet::open(out), m1);
  // Invalid input fails before anything is written.
  std::vector<WriteTensor> dup = m2.tensors;
  dup.push_back(dup[0]);
  expect_error([&] { write_model(out, dup, 24); }, {"more than once"});
  expect_model(SafetensorsSet::open(out), m1);
}

// ---- sharded sets: a broken index or shard set, each named

TEST(SafetensorsIndex, EachProblemNamed) {
  TempDir dir;
  const float v[3] = {1, 2, 3};
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  // A directory with shards s1 {a, b} and s2 {c} (or {a, c} with overlap) and the given index.
  auto make = [&](const std::string& name, const std::string& index, bool overlap = false) {
    const fs::path d = dir.path() / name;
    fs::create_directories(d);
    write_file((d / s1).string(), {{"a", DType::F32, {1}, v}, {"b", DType::F32, {2}, v}});
    std::vector<WriteTensor> second = {{"c", DType::F32, {3}, v}};
    if (overlap) second.push_back({"a", DType::F32, {1}, v});
    write_file((d / s2).string(), second);
    write_bytes((d / "model.safetensors.index.json").string(), index);
    return d.string();
  };
  const std::string good_map = R"("a":")" + s1 + R"(","b":")" + s1 + R"(","c":")" + s2 + R"(")";
  const std::string idx = "/model.safetensors.index.json";

  const std::string ok =
      make("ok", R"({"metadata":{"total_size":24},"weight_map":{)" + good_map + "}}");
  EXPECT_EQ(SafetensorsSet::open(ok).names(), (std::vector<std::string>{"a", "b", "c"}));

  std::string d = make("bad_json", R"({"weight_map": {)");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "JSON"});
  d = make("not_object", R"(["weight_map"])");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "object"});
  d = make("no_weight_map", R"({"metadata":{"total_size":24}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "weight_map"});
  d = make("weight_map_array", R"({"weight_map":["a"]})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "weight_map"});
  d = make("shard_not_string", R"({"weight_map":{"a":1}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "'a'"});
  d = make("absolute_shard", R"({"weight_map":{"a":"/etc/passwd"}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "'a'", "/etc/passwd"});
  d = make("missing_shard",
           R"({"weight_map":{)" + good_map + R"(,"z":"model-00003-of-00003.safetensors"}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "model-00003-of-00003.safetensors"});
  d = make("absent_tensor", R"({"weight_map":{)" + good_map + R"(,"zz":")" + s2 + R"("}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + "/" + s2, "'zz'"});
  d = make("wrong_shard",
           R"({"weight_map":{"a":")" + s2 + R"(","b":")" + s1 + R"(","c":")" + s2 + R"("}})");
  expect_error([&] { SafetensorsSet::open(d); }, {s2, "'a'"});
  d = make("in_two_shards", R"({"weight_map":{)" + good_map + "}}", true);
  expect_error([&] { SafetensorsSet::open(d); }, {"'a'", s1, s2});
  d = make("duplicate_key", R"({"weight_map":{"a":")" + s1 + R"(","a":")" + s2 + R"("}})");
  expect_error([&] { SafetensorsSet::open(d); }, {d + idx, "'a'", "more than once"});
  // A corrupt shard is reported by its own path.
  d = make("corrupt_shard", R"({"weight_map":{)" + good_map + "}}");
  write_bytes(d + "/" + s2, raw_file("{", ""));
  expect_error([&] { SafetensorsSet::open(d); }, {d + "/" + s2, "JSON"});
  // Neither file, or nothing at all.
  fs::create_directories(dir.path() / "empty");
  expect_error([&] { SafetensorsSet::open(dir / "empty"); }, {dir / "empty", "model.safetensors"});
  expect_error([&] { SafetensorsSet::open(dir / "nowhere"); }, {dir / "nowhere"});
}

}  // namespace
}  // namespace titan::ckpt
