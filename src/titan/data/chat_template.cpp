#include "titan/data/chat_template.h"

#include "titan/core/error.h"

namespace titan::data {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
std::string lstrip_nl(const std::string& s) {
  const size_t i = s.find_first_not_of('\n');
  return i == std::string::npos ? "" : s.substr(i);
}
std::string rstrip_nl(const std::string& s) {
  const size_t i = s.find_last_not_of('\n');
  return i == std::string::npos ? "" : s.substr(0, i + 1);
}
// Python's s.split(sep)[-1] and s.split(sep)[0].
std::string after_last(const std::string& s, const std::string& sep) {
  const size_t i = s.rfind(sep);
  return i == std::string::npos ? s : s.substr(i + sep.size());
}
std::string before_first(const std::string& s, const std::string& sep) {
  const size_t i = s.find(sep);
  return i == std::string::npos ? s : s.substr(0, i);
}

}  // namespace

namespace {

// Appends text to the segments, merging it into the last one when the flag is the same.
void emit(std::vector<ChatSegment>* out, const std::string& text, bool trained) {
  if (text.empty()) return;
  if (!out->empty() && out->back().trained == trained)
    out->back().text += text;
  else
    out->push_back({text, trained});
}

// The template, rendered as segments: an assistant turn's text after its header, through its
// <|im_end|>, is trained when train(i) says so; everything else is not.
template <class Train>
std::vector<ChatSegment> render(const std::vector<ChatMessage>& m, bool add_generation_prompt,
                                bool enable_thinking, Train train) {
  check(!m.empty(), "a conversation needs at least one message");
  const auto n = static_cast<int64_t>(m.size());
  for (const auto& x : m)
    check(x.role == "system" || x.role == "user" || x.role == "assistant" || x.role == "tool",
          "unknown chat role '" + x.role + "' (expected system, user, assistant or tool)");
  std::vector<ChatSegment> out;
  auto plain = [&](const std::string& text) { emit(&out, text, false); };
  if (m[0].role == "system") plain("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  // The last user query (not a tool response wrapped as a user message).
  int64_t last_query = n - 1;
  for (int64_t i = n - 1; i >= 0; --i) {
    const ChatMessage& x = m[static_cast<size_t>(i)];
    if (x.role == "user" &&
        !(starts_with(x.content, "<tool_response>") && ends_with(x.content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const ChatMessage& x = m[static_cast<size_t>(i)];
    const bool first = i == 0, last = i == n - 1;
    if (x.role == "user" || (x.role == "system" && !first)) {
      plain("<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n");
    } else if (x.role == "assistant") {
      std::string content = x.content, reasoning, body;
      if (x.reasoning_content) {
        reasoning = *x.reasoning_content;
      } else if (content.find("</think>") != std::string::npos) {
        reasoning =
            lstrip_nl(after_last(rstrip_nl(before_first(x.content, "</think>")), "<think>"));
        content = lstrip_nl(after_last(x.content, "</think>"));
      }
      if (i > last_query && (last || !reasoning.empty()))
        body =
            "<think>\n" + lstrip_nl(rstrip_nl(reasoning)) + "\n</think>\n\n" + lstrip_nl(content);
      else
        body = content;
      body += "<|im_end|>";
      // The header ends with "\n"; the tokenizer's pre-tokenizer joins it with the body's leading
      // whitespace up to its last line break (one token across the boundary): that part stays
      // with the untrained header, so the segments tokenize as the whole text does.
      const size_t ws = body.find_first_not_of(" \t\r\n\f\v");
      const size_t nl = body.find_last_of("\r\n", ws);  // ws: never npos (body ends in a token)
      const size_t cut = nl == std::string::npos ? 0 : nl + 1;
      plain("<|im_start|>assistant\n" + body.substr(0, cut));
      emit(&out, body.substr(cut), train(i));
      plain("\n");
    } else if (x.role == "tool") {
      if (first || m[static_cast<size_t>(i - 1)].role != "tool") plain("<|im_start|>user");
      plain("\n<tool_response>\n" + x.content + "\n</tool_response>");
      if (last || m[static_cast<size_t>(i + 1)].role != "tool") plain("<|im_end|>\n");
    }
  }
  if (add_generation_prompt) {
    plain("<|im_start|>assistant\n");
    if (!enable_thinking) plain("<think>\n\n</think>\n\n");
  }
  return out;
}

}  // namespace

std::string qwen3_chat_format(const std::vector<ChatMessage>& m, bool add_generation_prompt,
                              bool enable_thinking) {
  std::string out;
  for (const auto& s :
       render(m, add_generation_prompt, enable_thinking, [](int64_t) { return false; }))
    out += s.text;
  return out;
}

std::vector<ChatSegment> qwen3_chat_segments(const std::vector<ChatMessage>& m,
                                             int64_t first_trained) {
  return render(m, false, true, [&](int64_t i) { return i >= first_trained; });
}

std::vector<ChatMessage> chat_messages(const nlohmann::json& a, const std::string& where) {
  check(a.is_array() && !a.empty(), where + ": 'messages' must be a non-empty array of " +
                                        "{\"role\": ..., \"content\": ...} objects");
  std::vector<ChatMessage> r;
  for (const auto& x : a) {
    const std::string at = where + ": message " + std::to_string(r.size());
    check(x.is_object() && x.contains("role") && x["role"].is_string(),
          at + " needs a string 'role'");
    check(x.contains("content") && x["content"].is_string(), at + " needs a string 'content'");
    ChatMessage c{x["role"].get<std::string>(), x["content"].get<std::string>(), std::nullopt};
    if (x.contains("reasoning_content") && x["reasoning_content"].is_string())
      c.reasoning_content = x["reasoning_content"].get<std::string>();
    check(c.role == "system" || c.role == "user" || c.role == "assistant" || c.role == "tool",
          at + ": unknown role '" + c.role + "' (expected system, user, assistant or tool)");
    r.push_back(std::move(c));
  }
  return r;
}

}  // namespace titan::data
