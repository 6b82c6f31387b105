// TRL's DPOTrainer tokenization (trl 1.16, DPOTrainer._prepare_dataset), reproduced:
// - no "prompt": the prompt is the longest run of messages chosen and rejected share from the
//   start (trl.extract_prompt), the rest of each their completion;
// - plain text: the tokenizer's EOS text is appended to chosen and to rejected unless they end
//   with it;
// - prompt, prompt + chosen and prompt + rejected are each rendered (conversational: Qwen3's chat
//   template, the prompt alone with the generation prompt, the others without) and tokenized
//   whole, without BOS/EOS;
// - the prompt's ids are the first k of its own, k the shortest common prefix of them with both
//   prompt + completion tokenizations; each completion is the rest of its prompt + completion.
#include "titan/data/preference.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/data/chat_template.h"
#include "titan/data/text_source.h"

namespace titan::data {
namespace {

using nlohmann::json;

std::vector<int32_t> encode(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids;
  tok.encode(text, false, false, &ids);
  return ids;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

bool same_message(const ChatMessage& a, const ChatMessage& b) {
  return a.role == b.role && a.content == b.content && a.reasoning_content == b.reasoning_content;
}

const json& field(const json& r, const char* name, const std::string& at) {
  check(r.contains(name), at + ": the preference record has no \"" + name +
                              "\" (TRL's preference format: \"prompt\", \"chosen\", \"rejected\")");
  return r.at(name);
}

}  // namespace

PreferencePair preference_pair(const json& r, const Tokenizer& tok, const std::string& at) {
  check(r.is_object(), at + ": a preference record must be a JSON object");
  const json& chosen = field(r, "chosen", at);
  const json& rejected = field(r, "rejected", at);
  const bool conversational = chosen.is_array();
  const auto kind = [&](const json& v, const char* name) {
    check(conversational ? v.is_array() : v.is_string(),
          at + ": \"" + name + "\" must be " +
              (conversational ? "a list of messages, as \"chosen\" is"
                              : "a string, as \"chosen\" is (or all of them lists of messages)"));
  };
  check(conversational || chosen.is_string(),
        at + ": \"chosen\" must be a string or a list of messages");
  kind(rejected, "rejected");
  std::vector<int32_t> prompt, with_chosen, with_rejected;
  if (conversational) {
    std::vector<ChatMessage> p, c = chat_messages(chosen, at), j = chat_messages(rejected, at);
    if (r.contains("prompt")) {
      kind(r.at("prompt"), "prompt");
      p = chat_messages(r.at("prompt"), at);
    } else {  // trl.extract_prompt: the messages both share from the start
      size_t k = 0;
      while (k < c.size() && k < j.size() && same_message(c[k], j[k])) ++k;
      p.assign(c.begin(), c.begin() + static_cast<long>(k));
      c.erase(c.begin(), c.begin() + static_cast<long>(k));
      j.erase(j.begin(), j.begin() + static_cast<long>(k));
    }
    check(!p.empty(), at + ": the preference record has an empty prompt");
    check(!c.empty() && !j.empty(), at + ": \"" + (c.empty() ? "chosen" : "rejected") +
                                        "\" has no messages after the prompt");
    const auto render = [&](const std::vector<ChatMessage>& completion) {
      std::vector<ChatMessage> all = p;
      all.insert(all.end(), completion.begin(), completion.end());
      return encode(tok, qwen3_chat_format(all, false, true));
    };
    prompt = encode(tok, qwen3_chat_format(p, true, true));
    with_chosen = render(c);
    with_rejected = render(j);
  } else {
    std::string p, c = chosen.get<std::string>(), j = rejected.get<std::string>();
    if (r.contains("prompt")) {
      kind(r.at("prompt"), "prompt");
      p = r.at("prompt").get<std::string>();
    } else {  // trl.extract_prompt on strings: the common prefix, not ending inside a space
      size_t k = 0;
      while (k < c.size() && k < j.size() && c[k] == j[k]) ++k;
      if (k > 0 && k < std::min(c.size(), j.size()) && c[k - 1] == ' ') --k;
      p = c.substr(0, k);
      c.erase(0, k);
      j.erase(0, k);
    }
    check(!p.empty(), at + ": the preference record has an empty prompt");
    check(!c.empty() && !j.empty(),
          at + ": \"" + (c.empty() ? "chosen" : "rejected") + "\" is empty");
    if (const auto eos = tok.eos_id()) {
      const std::string e = tok.decode({*eos});
      for (std::string* s : {&c, &j})
        if (!e.empty() && !s->ends_with(e)) *s += e;
    }
    prompt = encode(tok, p);
    with_chosen = encode(tok, p + c);
    with_rejected = encode(tok, p + j);
  }
  const size_t k =
      std::min(common_prefix(prompt, with_chosen), common_prefix(prompt, with_rejected));
  PreferencePair out;
  out.prompt.assign(prompt.begin(), prompt.begin() + static_cast<long>(k));
  out.chosen.assign(with_chosen.begin() + static_cast<long>(k), with_chosen.end());
  out.rejected.assign(with_rejected.begin() + static_cast<long>(k), with_rejected.end());
  check(!out.chosen.empty() && !out.rejected.empty(),
        at + ": \"" + (out.chosen.empty() ? "chosen" : "rejected") +
            "\" adds no tokens after the prompt");
  return out;
}

std::vector<PreferencePair> read_preference_pairs(const SourceOptions& o, const Tokenizer& tok,
                                                  int64_t max_tokens, PreferenceStats* stats) {
  PreferenceStats local;
  PreferenceStats& st = stats ? *stats : local;
  st = PreferenceStats{};
  std::vector<PreferencePair> pairs;
  read_json_records(
      o, &st.source, [&](const json& j, const std::string& at, const std::string& what) {
        PreferencePair p;
        try {
          p = preference_pair(j, tok, at);
        } catch (const Error& e) {
          if (!o.skip_malformed) throw Error(e.what() + skip_malformed_hint(o, what));
          if (st.bad_records++ == 0) st.first_bad = at;
          return;
        }
        ++st.records;
        const auto longest =
            static_cast<int64_t>(p.prompt.size() + std::max(p.chosen.size(), p.rejected.size()));
        if (max_tokens > 0 && longest > max_tokens) {
          if (!o.skip_malformed)
            throw Error(at + ": the preference pair holds " + std::to_string(longest) +
                        " tokens, more than training.seq_len + 1 = " + std::to_string(max_tokens) +
                        "; raise training.seq_len" + skip_malformed_hint(o, what));
          if (st.too_long++ == 0) st.first_too_long = at;
          return;
        }
        pairs.push_back(std::move(p));
      });
  if (pairs.empty()) {
    const std::string problems = describe_problems(st.source, o.text_field);
    throw Error("dataset at '" + source_path(o) + "' has no preference pairs to train on" +
                (problems.empty() ? "" : " (" + problems + ")") +
                (st.bad_records > 0 ? " (" + std::to_string(st.bad_records) +
                                          " malformed records skipped, first " + st.first_bad + ")"
                                    : "") +
                (st.too_long > 0
                     ? " (" + std::to_string(st.too_long) +
                           " longer than training.seq_len + 1, first " + st.first_too_long + ")"
                     : "") +
                "; point " + o.section + ".dataset_path at records of \"prompt\", \"chosen\", " +
                "\"rejected\"");
  }
  return pairs;
}

}  // namespace titan::data
