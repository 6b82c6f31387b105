// checksums.json: chunk hashes equal the packaged libxxhash's XXH3-64 of each 16 MiB chunk (so
// xxhsum -H3 on split chunks reproduces them), the one-pass verified reader converts exactly as
// read_f32 does, and any flipped bit, truncation or missing file is an error naming the file.
#include "titan/checkpoint/checksums.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "test_util.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/checkpoint/xxh3.h"

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;
using titan::testing::error_of;

TEST(Checksums, ChunkHashesMatchThePackagedLibrary) {
  std::vector<uint8_t> data(kChecksumChunkBytes * 2 + 12345);
  std::mt19937 rng(1);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const auto h = chunk_hashes(data.data(), data.size());
  ASSERT_EQ(h.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    const size_t off = c * kChecksumChunkBytes;
    EXPECT_EQ(h[c],
              XXH3_64bits(data.data() + off, std::min(kChecksumChunkBytes, data.size() - off)))
        << xxh3::variant();
  }
  xxh3::Stream s;
  s.update(data.data(), 1000);
  s.update(data.data() + 1000, 5000);
  EXPECT_EQ(s.digest(), XXH3_64bits(data.data(), 6000));
  EXPECT_TRUE(chunk_hashes(nullptr, 0).empty());
}

// The fused hash of the verified reader: XXH3-64 exactly, every byte visited once, in order, in
// pieces of whole 1 KiB blocks, for lengths around XXH3's short/long boundary and block edges;
// in every build of it this CPU runs.
TEST(Checksums, HashVisitIsXxh3AndVisitsEveryByteOnce) {
  for (const char* variant : xxh3::runnable_variants()) {
    std::vector<uint8_t> data(70000);
    std::mt19937 rng(3);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (size_t n : {size_t{0}, size_t{1}, size_t{240}, size_t{241}, size_t{1023}, size_t{1024},
                     size_t{1025}, size_t{4096}, size_t{4097}, size_t{65536 + 63}, size_t{70000}}) {
      for (size_t piece : {size_t{1}, size_t{1024}, size_t{4096}, size_t{5000}}) {
        std::vector<std::pair<size_t, size_t>> seen;
        const uint64_t h = xxh3::hash_visit_as(
            variant, data.data(), n, piece,
            [](void* ctx, size_t off, size_t len) {
              static_cast<std::vector<std::pair<size_t, size_t>>*>(ctx)->push_back({off, len});
            },
            &seen);
        EXPECT_EQ(h, XXH3_64bits(data.data(), n)) << n << " " << variant;
        size_t at = 0;
        for (size_t i = 0; i < seen.size(); ++i) {
          EXPECT_EQ(seen[i].first, at) << n;
          EXPECT_GT(seen[i].second, 0u) << n;
          if (i + 1 < seen.size()) {
            EXPECT_EQ(seen[i].second % 1024, 0u) << n;
          }
          at += seen[i].second;
        }
        EXPECT_EQ(at, n) << n << " " << piece;
      }
    }
  }
}

// A file whose tensors straddle chunk boundaries, read in one verified pass.
TEST(Checksums, VerifiedReadConvertsLikeReadF32AndCatchesDamage) {
  const std::string dir = titan::testing::fresh_temp_dir("checksums");
  const int64_t big = static_cast<int64_t>(kChecksumChunkBytes / 4) + 777;  // > one chunk
  std::vector<float> a(static_cast<size_t>(big)), b(3000);
  std::vector<uint16_t> c(static_cast<size_t>(big / 2));
  std::mt19937 rng(2);
  for (auto& x : a) x = static_cast<float>(rng()) / 1e9f;
  for (auto& x : b) x = static_cast<float>(rng()) / 1e9f;
  for (auto& x : c) x = static_cast<uint16_t>(0x3f00 + rng() % 0x100);  // bf16 near 0.5..1
  const std::string file = dir + "/model.safetensors";
  write_file(file, {{"a", DType::F32, {big}, a.data()},
                    {"b", DType::F32, {30, 100}, b.data()},
                    {"c", DType::BF16, {big / 2}, c.data()}});
  std::ofstream(dir + "/train_state.json") << "{}";
  write_checksums(dir);
  const auto sums = read_checksums(dir);
  ASSERT_TRUE(sums && sums->count("model.safetensors") && sums->count("train_state.json"));
  EXPECT_EQ(sums->at("model.safetensors").chunks.size(), 2u);  // 24 MiB
  EXPECT_TRUE(verify_checksums(dir));

  auto read_all = [&](const FileSum* sum, std::vector<float>* got) {
    SafetensorsFile f = SafetensorsFile::open(file);
    got->assign(static_cast<size_t>(big + 3000 + big / 2), -1.0f);
    std::vector<TensorRead> reads = {{f.find("c"), got->data() + big + 3000},
                                     {f.find("a"), got->data()},
                                     {f.find("b"), got->data() + big}};
    read_verified(file, f.bytes(), f.size(), reads, sum);
  };
  std::vector<float> got, want(static_cast<size_t>(big + 3000 + big / 2));
  SafetensorsSet set = SafetensorsSet::open(file);
  set.read_f32("a", {big}, want.data());
  set.read_f32("b", {30, 100}, want.data() + big);
  set.read_f32("c", {big / 2}, want.data() + big + 3000);
  read_all(&sums->at("model.safetensors"), &got);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
  read_all(nullptr, &got);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));

  // One flipped bit in the second chunk.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kChecksumChunkBytes + 99));
    f.put(static_cast<char>(0x40));
  }
  const std::string err = error_of([&] { read_all(&sums->at("model.safetensors"), &got); });
  EXPECT_NE(err.find(file + ": checksum mismatch in bytes 16777216.."), std::string::npos) << err;
  EXPECT_NE(error_of([&] { verify_checksums(dir); }).find(file + ": checksum mismatch"),
            std::string::npos);
  std::ofstream(dir + "/train_state.json") << "{ }";
  fs::remove(file);
  EXPECT_NE(error_of([&] { verify_checksums(dir); }).find("model.safetensors: listed in"),
            std::string::npos);
  std::ofstream(dir + "/checksums.json") << "{\"algorithm\": \"md5\"}";
  EXPECT_NE(error_of([&] { read_checksums(dir); }).find("\"algorithm\" must be \"xxh3_64\""),
            std::string::npos);
  fs::remove(dir + "/checksums.json");
  EXPECT_FALSE(verify_checksums(dir));
}

}  // namespace
}  // namespace titan::ckpt
