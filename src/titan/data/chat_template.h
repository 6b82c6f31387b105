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
#include <cstdint>
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

// A piece of the rendered conversation and whether the loss is taken on it.
struct ChatSegment {
  std::string text;
  bool trained = false;
};

// qwen3_chat_format(m, false, ...) (the whole conversation, no generation prompt) as consecutive
// segments, adjacent ones differing in `trained`; their texts concatenated are that string. The
// trained spans are the assistant turns from index first_trained on (0: all of them; the prompt
// messages of a prompt + completion record come before): each starts right after the turn's
// "<|im_start|>assistant\n" header and ends with (includes) its "<|im_end|>"; the "\n" after it,
// system, user and tool turns and the headers are not trained. The boundary rule, so that
// tokenizing each segment on its own gives the ids of tokenizing the whole text (a byte-level BPE
// whose added tokens, <|im_end|> and <think> among them, are matched first): a body opening with
// whitespace that holds a line break keeps that whitespace, through its last line break, with
// the untrained header, since the pre-tokenizer's \s*[\r\n]+ joins it with the header's "\n"
// into one token. (This is also where transformers' offsets put such a token: before the span.)
std::vector<ChatSegment> qwen3_chat_segments(const std::vector<ChatMessage>& messages,
                                             int64_t first_trained = 0);

// Messages from a JSON array of {"role", "content"[, "reasoning_content"]} objects; `where`
// (file:line) names the record in errors.
std::vector<ChatMessage> chat_messages(const nlohmann::json& array, const std::string& where);

}  // namespace titan::data
