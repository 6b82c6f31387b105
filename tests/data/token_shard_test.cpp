// Pre-tokenized shards: round trip, one-line errors naming the file for bad shards, and the same
// batches as tokenizing the text (shuffled epochs, data-parallel ranks, resumption).
#include "titan/data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/dataset.h"
#include "titan/data/packed_loader.h"

namespace titan::data {
namespace {

using titan::testing::error_of;

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& p, const std::string& b) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
}

TEST(TokenShard, RoundTrip) {
  const std::string d = titan::testing::fresh_temp_dir("shard_rt");
  const std::string p = d + "/s.bin";
  write_token_shard(p, {0, 3, 3, 5}, {7, 8, 9, 1, 2}, 10);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp" + std::to_string(getpid())));
  TokenShard s = TokenShard::open(p);
  EXPECT_EQ(s.num_documents(), 3);
  EXPECT_EQ(s.num_tokens(), 5);
  EXPECT_EQ(s.vocab_size(), 10);
  auto d0 = s.document(0), d1 = s.document(1), d2 = s.document(2);
  EXPECT_EQ(std::vector<uint32_t>(d0.begin(), d0.end()), (std::vector<uint32_t>{7, 8, 9}));
  EXPECT_TRUE(d1.empty());
  EXPECT_EQ(std::vector<uint32_t>(d2.begin(), d2.end()), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(std::filesystem::file_size(p), 64u + 8 * 4 + 4 * 5);
  EXPECT_EQ(read_bytes(p).substr(0, 8), "TITANTOK");
}

TEST(TokenShard, BadShardsNameTheFile) {
  const std::string d = titan::testing::fresh_temp_dir("shard_bad");
  const std::string good = d + "/good.bin";
  write_token_shard(good, {0, 2, 4}, {1, 2, 3, 4}, 8);
  const std::string bytes = read_bytes(good);
  auto expect = [&](const std::string& name, const std::string& content, const std::string& what) {
    const std::string p = d + "/" + name;
    write_bytes(p, content);
    std::string msg = error_of([&] { TokenShard::open(p); });
    EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << name << ": " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  expect("empty.bin", "", "shorter than the 64-byte header");
  expect("short.bin", bytes.substr(0, 20), "shorter than the 64-byte header");
  std::string b = bytes;
  b[0] = 'X';
  expect("magic.bin", b, "not a titan token shard (bad magic");
  b = bytes;
  b[8] = 2;
  expect("version.bin", b, "token shard version 2 is not supported");
  b = bytes;
  b[12] = 7;
  expect("dtype.bin", b, "token shard id dtype 7 is not supported");
  expect("truncated.bin", bytes.substr(0, bytes.size() - 2),
         "truncated or corrupt token shard: 2 documents and 4 tokens need 104 bytes, the file "
         "has 102");
  b = bytes;
  b[24] = static_cast<char>(0xff);  // document count 255
  expect("count.bin", b, "corrupt token shard");
  b = bytes;
  b[64 + 8] = 5;  // offsets 0, 5, 4
  expect("offsets.bin", b, "offsets decrease at document 1");
  std::string msg = error_of([&] { TokenShard::open(d + "/none.bin"); });
  EXPECT_NE(msg.find(d + "/none.bin: cannot open the token shard"), std::string::npos) << msg;

  // An id past the recorded vocabulary is caught when the document is read.
  const std::string high = d + "/high.bin";
  write_token_shard(high, {0, 2}, {1, 9}, 8);
  std::vector<TokenShard> v;
  v.push_back(TokenShard::open(high));
  TokenDocuments docs(std::move(v));
  std::vector<int32_t> out;
  msg = error_of([&] { docs.tokens(0, &out); });
  EXPECT_NE(msg.find(high + ": corrupt token shard (document 0 holds id 9"), std::string::npos)
      << msg;
}

// Every batch of `a` and `b` over `n` steps (inputs, labels and positions).
void expect_same_batches(PackedLoader& a, PackedLoader& b, int64_t tokens, int steps) {
  std::vector<int32_t> in1(tokens), lab1(tokens), pos1(tokens), in2(tokens), lab2(tokens),
      pos2(tokens);
  for (int s = 0; s < steps; ++s) {
    ASSERT_EQ(a.next(in1.data(), lab1.data(), pos1.data()),
              b.next(in2.data(), lab2.data(), pos2.data()));
    ASSERT_EQ(in1, in2) << "step " << s;
    ASSERT_EQ(lab1, lab2) << "step " << s;
    ASSERT_EQ(pos1, pos2) << "step " << s;
  }
}

TEST(TokenShard, SameBatchesAsTokenizingTheText) {
  const std::string d = titan::testing::fresh_temp_dir("shard_same");
  {
    std::ofstream f(d + "/corpus.jsonl");
    for (int i = 0; i < 40; ++i) {
      f << "{\"text\": \"document " << i << ": " << std::string(static_cast<size_t>(i % 7), 'x')
        << " caf\\u00e9 \\u4e2d\\u6587 the end\"}\n";
      if (i % 10 == 3) f << "{\"text\": \"\"}\n";
    }
  }
  for (const std::string& tok_spec :
       {std::string("byte"), titan::testing::asset("tokenizers/tiny-bpe-2k")}) {
    auto tok = make_tokenizer(tok_spec);
    SourceOptions src;
    src.dataset = "auto";
    src.path = d + "/corpus.jsonl";
    const std::string shard = d + "/corpus.bin";
    TokenizeStats st = tokenize_to_shard(src, *tok, shard);
    EXPECT_EQ(st.documents, 40);
    EXPECT_EQ(st.source.empty, 4);

    DatasetSpec text_spec, shard_spec;
    text_spec.source = src;
    text_spec.tokenizer = tok_spec;
    shard_spec.source.dataset = "auto";  // by the .bin extension
    shard_spec.source.path = shard;
    auto text_docs = open_dataset(text_spec);
    auto shard_docs = open_dataset(shard_spec);
    ASSERT_NE(dynamic_cast<const TokenDocuments*>(shard_docs.get()), nullptr);
    EXPECT_EQ(shard_docs->size(), text_docs->size());
    EXPECT_EQ(shard_docs->vocab_size(), tok->vocab_size());
    for (int64_t rank = 0; rank < 2; ++rank) {
      LoaderOptions o;
      o.batch = 2;
      o.seq_len = 24;
      o.dp_rank = rank;
      o.dp_world = 2;
      o.seed = 5;
      PackedLoader a(text_docs, o), b(shard_docs, o);
      // Several shuffled epochs.
      expect_same_batches(a, b, o.batch * o.seq_len, 40);
      EXPECT_GE(a.epoch(), 2);
      // A restored shard loader continues as the text loader does.
      PackedLoader c(shard_docs, o);
      c.restore(b.state());
      expect_same_batches(a, c, o.batch * o.seq_len, 5);
    }
  }
}

TEST(TokenShard, DatasetsOfShardsAndMixedPaths) {
  const std::string d = titan::testing::fresh_temp_dir("shard_dir");
  write_token_shard(d + "/a.bin", {0, 3}, {5, 6, 7}, 300);
  write_token_shard(d + "/b.bin", {0, 2, 4}, {8, 9, 10, 11}, 259);
  DatasetSpec spec;
  spec.source.dataset = "tokens";
  spec.source.path = d;
  auto docs = open_dataset(spec);
  EXPECT_EQ(docs->size(), 3);
  EXPECT_EQ(docs->vocab_size(), 300);
  std::vector<int32_t> ids;
  docs->tokens(2, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{10, 11}));
  EXPECT_NE(docs->vocab_source().find("the token shards ('" + d + "/a.bin', ...)"),
            std::string::npos);

  std::ofstream(d + "/c.txt") << "text\n";
  spec.source.dataset = "auto";
  std::string msg = error_of([&] { open_dataset(spec); });
  EXPECT_NE(msg.find("mixes token shards (.bin) with text files"), std::string::npos) << msg;
  write_token_shard(d + "/none.bin", {0}, {}, 259);
  spec.source.path = d + "/none.bin";
  msg = error_of([&] { open_dataset(spec); });
  EXPECT_NE(msg.find("has no documents"), std::string::npos) << msg;
}

}  // namespace
}  // namespace titan::data
