#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "titan/core/error.h"
#include "titan/data/packed_loader.h"
#include "titan/data/text_source.h"

namespace titan::data {
namespace {

TEST(Utf8, FindsInvalidSequences) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("\xc3"), 0u);              // truncated
  EXPECT_EQ(find_invalid_utf8("x\xc0\xaf"), 1u);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);      // surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
}

TEST(TextSource, FortunesRecordsAndTextLines) {
  auto dir = std::filesystem::temp_directory_path() / ("titan_data_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a") << "first\nrecord\n%\nsecond\n%\n%\nthird\n";
  std::ofstream(dir / "a.dat") << "binary index, skipped";
  auto docs = load_documents("fortunes", dir.string());
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first\nrecord\n");
  EXPECT_EQ(docs[2], "third\n");
  std::ofstream(dir / "t.txt") << "one\n\ntwo\n";
  auto lines = load_documents("text", (dir / "t.txt").string());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "two");
  EXPECT_THROW(load_documents("c4", dir.string()), Error);
  EXPECT_THROW(load_documents("text", (dir / "missing").string()), Error);
}

TEST(PackedLoader, ShiftsInsideDocumentsAndResetsPositions) {
  ByteTokenizer tok;
  LoaderOptions o;
  o.batch = 2;
  o.seq_len = 8;
  o.shuffle = false;
  PackedLoader l({"abc", "defghij", "kl"}, tok, o);
  std::vector<int32_t> in(16), lab(16), pos(16);
  l.next(in.data(), lab.data(), pos.data());
  // Doc "abc": ids BOS a b c EOS -> inputs BOS a b c, labels a b c EOS, positions 0..3.
  EXPECT_EQ(in[0], ByteTokenizer::kBos);
  EXPECT_EQ(lab[0], 'a');
  EXPECT_EQ(lab[3], ByteTokenizer::kEos);
  EXPECT_EQ(in[4], ByteTokenizer::kBos);  // the next document starts
  for (int t = 0; t < 16; ++t) {
    EXPECT_NE(in[t], ByteTokenizer::kEos) << "EOS is never an input";
    EXPECT_NE(lab[t], ByteTokenizer::kBos) << "BOS is never a label";
  }
  const std::vector<int32_t> expect_pos = {0, 1, 2, 3, 0, 1, 2, 3,
                                           // row 2 starts inside "defghij": re-based to 0
                                           0, 1, 2, 3, 0, 1, 2, 0};
  EXPECT_EQ(pos, expect_pos);
}

TEST(PackedLoader, RanksSeeDisjointDocumentsAndShuffleIsSeeded) {
  std::vector<std::string> docs;
  for (int i = 0; i < 10; ++i) docs.push_back(std::string(1, static_cast<char>('a' + i)));
  ByteTokenizer tok;
  std::set<int32_t> seen[2];
  for (int r = 0; r < 2; ++r) {
    LoaderOptions o;
    o.batch = 1;
    o.seq_len = 10;  // five 2-token documents per row
    o.dp_rank = r;
    o.dp_world = 2;
    o.shuffle = false;
    PackedLoader l(docs, tok, o);
    std::vector<int32_t> in(10), lab(10), pos(10);
    l.next(in.data(), lab.data(), pos.data());
    for (int32_t id : lab)
      if (id < 256) seen[r].insert(id);
  }
  EXPECT_EQ(seen[0], (std::set<int32_t>{'a', 'c', 'e', 'g', 'i'}));
  EXPECT_EQ(seen[1], (std::set<int32_t>{'b', 'd', 'f', 'h', 'j'}));

  auto epochs = [&](uint64_t seed) {
    LoaderOptions o;
    o.batch = 1;
    o.seq_len = 20;
    o.seed = seed;
    PackedLoader l(docs, tok, o);
    std::vector<int32_t> in(20), lab(20), pos(20), all;
    for (int i = 0; i < 3; ++i) {
      l.next(in.data(), lab.data(), pos.data());
      all.insert(all.end(), lab.begin(), lab.end());
    }
    return all;
  };
  EXPECT_EQ(epochs(1), epochs(1));
  EXPECT_NE(epochs(1), epochs(2));
}

}  // namespace
}  // namespace titan::data
