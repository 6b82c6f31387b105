// The tokenizer interface and the documents a loader reads: BOS/EOS as torchtitan adds them for
// the byte-level and Hugging Face tokenizers, and single-pass loading for validation.
#include "titan/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/byte_tokenizer.h"
#include "titan/data/packed_loader.h"

namespace titan::data {
namespace {

TEST(Tokenizer, ByteIsTheByteTokenizer) {
  auto tok = make_tokenizer("byte");
  EXPECT_EQ(tok->name(), "byte");
  EXPECT_EQ(tok->vocab_size(), 259);
  std::vector<int32_t> a, b;
  tok->encode("h\xc3\xa9", true, true, &a);
  ByteTokenizer().encode("h\xc3\xa9", true, true, &b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(tok->decode(a), "h\xc3\xa9");
}

TEST(Tokenizer, MissingPathNamesTheField) {
  try {
    make_tokenizer("/nonexistent/tok");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "dataloader.tokenizer '/nonexistent/tok' is neither 'byte' nor an existing"),
              std::string::npos)
        << e.what();
  }
}

TEST(TextDocuments, BosAndEosAsTorchtitanAddsThem) {
  // tiny-bpe-2k has both: <|begin_of_text|> = 2002, <|end_of_text|> = 2003.
  TextDocuments tiny({"hello"}, make_tokenizer(titan::testing::asset("tokenizers/tiny-bpe-2k")));
  std::vector<int32_t> ids;
  tiny.tokens(0, &ids);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 2002);
  EXPECT_EQ(ids.back(), 2003);
  EXPECT_EQ(tiny.vocab_size(), 2020);
  // Qwen3 has no BOS: only EOS is added (this tokenizer_config.json's eos_token <|im_end|>).
  TextDocuments qwen({"hello"}, make_tokenizer(titan::testing::asset("tokenizers/qwen3")));
  ids.clear();
  qwen.tokens(0, &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{14990, 151645}));
  EXPECT_NE(qwen.vocab_source().find("dataloader.tokenizer '"), std::string::npos);
}

// Weighted mixing: over 10,000 documents each source's share is within 1% of its weight (smooth
// round-robin keeps every prefix within one document), every document of every source appears,
// a small source repeats in order, and the mix is fixed by the weights (opened twice, the same).
TEST(MixedDocuments, ProportionsFollowTheWeights) {
  const std::string d = titan::testing::fresh_temp_dir("mix");
  std::string a, b, c;
  const auto add = [](std::string* to, const char* head, int i, const char* tail) {
    to->append(head).append(std::to_string(i)).append(tail);
  };
  for (int i = 0; i < 9000; ++i) add(&a, "a", i, "\n");
  for (int i = 0; i < 50; ++i) add(&b, "b", i, "\n");
  for (int i = 0; i < 3000; ++i) add(&c, "{\"text\": \"c", i, "\"}\n");
  std::ofstream(d + "/a.txt") << a;
  std::ofstream(d + "/b.txt") << b;
  std::ofstream(d + "/c.jsonl") << c;
  DatasetSpec spec;
  spec.source.dataset = "auto";
  spec.source.path = d + "/a.txt, " + d + "/b.txt," + d + "/c.jsonl";
  spec.weights = {5, 2, 3};
  const auto docs = open_dataset(spec);
  const auto* mix = dynamic_cast<const MixedDocuments*>(docs.get());
  ASSERT_NE(mix, nullptr);
  EXPECT_EQ(mix->size(), 18000);  // a's 9000 documents at half the mix
  std::vector<int64_t> count(3, 0);
  for (int64_t i = 0; i < 10000; ++i) ++count[static_cast<size_t>(mix->source_of(i))];
  EXPECT_NEAR(count[0] / 10000.0, 0.5, 0.01);
  EXPECT_NEAR(count[1] / 10000.0, 0.2, 0.01);
  EXPECT_NEAR(count[2] / 10000.0, 0.3, 0.01);
  for (int64_t n : {7, 100, 999, 10000, 18000}) {  // every prefix within one document
    std::vector<double> k(3, 0);
    for (int64_t i = 0; i < n; ++i) ++k[static_cast<size_t>(mix->source_of(i))];
    EXPECT_LE(std::abs(k[0] - 0.5 * n), 1.0) << n;
    EXPECT_LE(std::abs(k[1] - 0.2 * n), 1.0) << n;
  }
  std::vector<int32_t> ids;
  const auto tok = make_tokenizer("byte");
  std::vector<int32_t> want;
  for (int64_t i = 0; i < mix->size(); ++i) {
    if (mix->source_of(i) != 1) continue;
    ids.clear();
    mix->tokens(i, &ids);
    want.clear();
    tok->encode(std::string("b").append(std::to_string(mix->document_of(i))), true, true, &want);
    ASSERT_EQ(ids, want) << i;
  }
  std::vector<bool> seen(9000, false);
  for (int64_t i = 0; i < mix->size(); ++i)
    if (mix->source_of(i) == 0) seen[static_cast<size_t>(mix->document_of(i))] = true;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), false), 0);
  const auto again = open_dataset(spec);
  for (int64_t i = 0; i < mix->size(); i += 101) {
    EXPECT_EQ(dynamic_cast<const MixedDocuments*>(again.get())->source_of(i), mix->source_of(i));
  }
  spec.weights = {1, 1};
  const std::string msg = titan::testing::error_of([&] { open_dataset(spec); });
  EXPECT_NE(
      msg.find("dataloader.dataset_weights has 2 weight(s) but dataloader.dataset_path names 3"),
      std::string::npos)
      << msg;
}

TEST(PackedLoader, SinglePassPadsTheLastBatchAndStops) {
  LoaderOptions o;
  o.batch = 2;
  o.seq_len = 4;
  o.shuffle = false;
  o.repeat = false;
  // Byte ids with BOS/EOS: "abcdefg" -> 8 inputs, "hij" -> 4: three full rows of 4, nothing left.
  PackedLoader l({"abcdefg", "hij"}, ByteTokenizer(), o);
  std::vector<int32_t> in(8), lab(8), pos(8);
  EXPECT_EQ(l.next(in.data(), lab.data(), pos.data()), 2);
  EXPECT_EQ(l.next(in.data(), lab.data(), pos.data()), 1);
  EXPECT_EQ(lab[3], ByteTokenizer::kEos);
  for (int t = 4; t < 8; ++t) {
    EXPECT_EQ(in[t], 0);
    EXPECT_EQ(lab[t], -100);
    EXPECT_EQ(pos[t], t - 4);
  }
  EXPECT_EQ(l.next(in.data(), lab.data(), pos.data()), 0);
  EXPECT_EQ(l.next(in.data(), lab.data(), pos.data()), 0);
  // An incomplete last row is dropped.
  PackedLoader l2({"abcdefg", "hi"}, ByteTokenizer(), o);
  EXPECT_EQ(l2.next(in.data(), lab.data(), pos.data()), 2);
  EXPECT_EQ(l2.next(in.data(), lab.data(), pos.data()), 0);
}

}  // namespace
}  // namespace titan::data
