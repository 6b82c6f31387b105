// Qwen3's chat template (the `chat_template` of Qwen3's tokenizer_config.json, as
// transformers' apply_chat_template renders it), for generation and chat fine-tuning. Messages
// are ChatML turns: "<|im_start|>ROLE\nCONTENT<|im_end|>\n". What the template does beyond that,
// reproduced here without tools:
// - a first system message is rendered first; later system messages in place;
// - an assistant turn after the last user query shows its reasoning as
//   "<think>\nREASONING\n</think>\n\n" + content when it is the last turn or has reasoning
//   (reasoning_content, else the text before "</think>" in the content); earlier assistant turns
//   keep only the content after "</think>";
// - tool messages become "<tool_response>" blocks inside one user turn per run of them;
// - add_generation_prompt opens the assistant turn, followed by an empty think block
//   ("<think>\n\n</think>\n\n") when thinking is disabled (enable_thinking=False).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace titan::data {

struct ChatMessage {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant turns only
};

// Throws titan::Error for no messages or an unknown role.
std::string qwen3_chat_format(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                              bool enable_thinking);

// Messages from a JSON array of {"role", "content"[, "reasoning_content"]} objects; `where`
// (file:line) names the record in errors.
std::vector<ChatMessage> chat_messages(const nlohmann::json& array, const std::string& where);

}  // namespace titan::data
