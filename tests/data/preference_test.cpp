// Preference records (data/preference.h) against the real TRL: tests/fixtures/dpo/tokenize.json
// holds records and the ids TRL 1.16's DPOTrainer makes of them with the Qwen3 tokenizer
// (tools/make_dpo_fixtures.py). Plus the refusals of malformed records.
#include "titan/data/preference.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/text_source.h"
#include "titan/data/tokenizer.h"

namespace titan::data {
namespace {

using nlohmann::json;
using titan::testing::asset;
using titan::testing::error_of;

std::vector<int32_t> ids(const json& a) { return a.get<std::vector<int32_t>>(); }

TEST(Preference, TokenizedAsTrlDoes) {
  std::ifstream f(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/dpo/tokenize.json");
  const json fx = json::parse(f);
  const auto tok = make_tokenizer(asset("tokenizers/qwen3"));
  int n = 0;
  for (const json& c : fx.at("cases")) {
    const std::string what = c.at("format").get<std::string>();
    const PreferencePair p = preference_pair(c.at("record"), *tok, what);
    EXPECT_EQ(p.prompt, ids(c.at("prompt_ids"))) << what;
    EXPECT_EQ(p.chosen, ids(c.at("chosen_ids"))) << what;
    EXPECT_EQ(p.rejected, ids(c.at("rejected_ids"))) << what;
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(Preference, MalformedRecordsAreRefusedNamingTheRecord) {
  const auto tok = make_tokenizer("byte");
  const auto err = [&](const char* record) {
    return error_of([&] { preference_pair(json::parse(record), *tok, "pairs.jsonl:3"); });
  };
  EXPECT_NE(err(R"({"prompt": "a", "rejected": "b"})")
                .find("pairs.jsonl:3: the preference record "
                      "has no \"chosen\""),
            std::string::npos);
  EXPECT_NE(err(R"({"prompt": "a", "chosen": "b", "rejected": ""})").find("\"rejected\" is empty"),
            std::string::npos);
  EXPECT_NE(err(R"({"prompt": "", "chosen": "b", "rejected": "c"})").find("empty prompt"),
            std::string::npos);
  EXPECT_NE(err(R"({"prompt": "a", "chosen": "b", "rejected": 3})").find("must be a string"),
            std::string::npos);
  EXPECT_NE(err(R"({"prompt": [{"role": "user", "content": "q"}], "chosen": [],
                    "rejected": [{"role": "assistant", "content": "x"}]})")
                .find("\"chosen\" is empty"),
            std::string::npos);
  EXPECT_NE(err(R"([1, 2])").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(err(R"({"prompt": [{"role": "user", "content": "q"}],
                    "chosen": [{"role": "assistant", "content": "x"}],
                    "rejected": [{"role": "assistant", "content": "y"}],
                    "chat_template_kwargs": {"foo": 1}})")
                .find("chat_template_kwargs.foo is not supported"),
            std::string::npos);
}

// trl.extract_prompt compares characters: a difference inside a UTF-8 character (é, è share
// their first byte) ends the prompt before the character, as in Python.
TEST(Preference, ImplicitPlainPromptEndsAtACharacter) {
  const auto tok = make_tokenizer("byte");
  const PreferencePair p = preference_pair(
      json::parse(R"({"chosen": "caf\u00e9 au lait", "rejected": "caf\u00e8 noir"})"), *tok, "x");
  std::vector<int32_t> caf;
  tok->encode("caf", false, false, &caf);
  EXPECT_EQ(p.prompt, caf);
  const PreferencePair q =
      preference_pair(json::parse(R"({"chosen": "say yes", "rejected": "say no"})"), *tok, "x");
  std::vector<int32_t> say;
  tok->encode("say", false, false, &say);
  EXPECT_EQ(q.prompt, say);  // the space goes with the completions
}

TEST(Preference, LongPairsAreCutAsTrlMaxLengthAndPromptsFillingItLeftOut) {
  const std::string dir = titan::testing::fresh_temp_dir("preference");
  const std::string path = dir + "/pairs.jsonl";
  {
    std::ofstream o(path);
    o << R"({"prompt": "abcdef", "chosen": "ghij", "rejected": "k"})"
      << "\n"
      << R"({"prompt": "abcdefghijklmnop", "chosen": "q", "rejected": "r"})"
      << "\n";
  }
  SourceOptions so;
  so.dataset = "jsonl";
  so.path = path;
  const auto tok = make_tokenizer("byte");
  PreferenceStats st;
  const std::vector<PreferencePair> pairs = read_preference_pairs(so, *tok, 8, &st);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].prompt.size() + pairs[0].chosen.size(), 8u);  // keep_start
  EXPECT_EQ(st.truncated, 1);
  EXPECT_EQ(st.dropped_long, 1);
  EXPECT_EQ(st.first_dropped, path + ":2");
  // Nothing left: one line naming the file and what to do.
  const std::string e = error_of([&] { read_preference_pairs(so, *tok, 4); });
  EXPECT_NE(e.find("has no preference pairs to train on"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
}

}  // namespace
}  // namespace titan::data
