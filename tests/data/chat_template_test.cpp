// Qwen3's chat template against transformers' apply_chat_template on Qwen3's own
// tokenizer_config.json (fixture tests/fixtures/generate/chat.json,
// tools/make_generate_fixtures.py): string for string, single and multi-turn, with and without
// system messages (one empty), with reasoning in the content or in reasoning_content, tool
// responses, a late system message, unicode, each with and without the generation prompt and
// thinking; and the token ids of the rendered text as the tokenizers library encodes it (special
// tokens matched).
#include "titan/data/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"

namespace titan::data {
namespace {

TEST(ChatTemplate, RendersAsTransformersAndTokenizesAsTokenizers) {
  std::ifstream f(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/generate/chat.json");
  const nlohmann::json fx = nlohmann::json::parse(f);
  const auto tok = make_tokenizer(testing::asset("tokenizers/qwen3"));
  int n = 0;
  for (const auto& c : fx["cases"]) {
    const auto msgs = chat_messages(c["messages"], "case " + std::to_string(n));
    const std::string text = qwen3_chat_format(msgs, c["add_generation_prompt"].get<bool>(),
                                               c["enable_thinking"].get<bool>());
    EXPECT_EQ(text, c["text"].get<std::string>()) << c.dump();
    std::vector<int32_t> ids;
    tok->encode(text, false, false, &ids);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << c.dump();
    ++n;
  }
  EXPECT_EQ(n, 28);
}

TEST(ChatTemplate, RefusesMalformedMessages) {
  EXPECT_THROW(qwen3_chat_format({}, true, false), Error);
  EXPECT_THROW(
      chat_messages(nlohmann::json::parse(R"([{"role": "robot", "content": "x"}])"), "f:1"), Error);
  EXPECT_THROW(chat_messages(nlohmann::json::parse(R"([{"role": "user", "content": 3}])"), "f:1"),
               Error);
  EXPECT_THROW(chat_messages(nlohmann::json::parse(R"({"role": "user"})"), "f:1"), Error);
  try {
    chat_messages(nlohmann::json::parse(R"([{"content": "x"}])"), "chat.jsonl:7");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat.jsonl:7"), std::string::npos);
  }
}

}  // namespace
}  // namespace titan::data
