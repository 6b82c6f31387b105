// The tokenizer interface and the documents a loader reads: BOS/EOS as torchtitan adds them for
// the byte-level and Hugging Face tokenizers, and single-pass loading for validation.
#include "titan/data/dataset.h"

#include <gtest/gtest.h>

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
