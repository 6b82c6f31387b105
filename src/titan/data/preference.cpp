// TRL's DPOTrainer tokenization (trl 1.16, DPOTrainer._prepare_dataset), reproduced:
// - no "prompt": the prompt is the longest run of messages chosen and rejected share from the
//   start (trl.extract_prompt), the rest of each their completion;
// - plain text: the tokenizer's EOS is appended to chosen and to rejected unless they end with
//   it;
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
  for (const auto& [v, name] : {std::pair{&chosen, "chosen"}, std::pair{&rejected, "rejected"}})
    check(!v->empty(), at + ": \"" + name + "\" is empty");
  std::vector<int32_t> prompt, with_chosen, with_rejected;
  if (conversational) {
    std::vector<ChatMessage> p, c = chat_messages(chosen, at), j = chat_messages(rejected, at);
    if (r.contains("prompt")) {
      kind(r.at("prompt"), "prompt");
      p = chat_messages(r.at("prompt"), at);
    } else {  // trl.extract_prompt: the messages both share from the start
      const size_t n = std::min(c.size(), j.size());
      size_t k = 0;
      while (k < n && same_message(c[k], j[k])) ++k;
      if (k == n && n > 0) --k;  // no difference: TRL's loop leaves the last message out
      p.assign(c.begin(), c.begin() + static_cast<long>(k));
      c.erase(c.begin(), c.begin() + static_cast<long>(k));
      j.erase(j.begin(), j.begin() + static_cast<long>(k));
    }
    check(!p.empty(), at + ": the preference record has an empty prompt");
    check(!c.empty() && !j.empty(), at + ": \"" + (c.empty() ? "chosen" : "rejected") +
                                        "\" has no messages after the prompt");
    check(!r.contains("tools") || r.at("tools").is_null(),
          at + ": preference records with \"tools\" are not supported (the chat template is "
               "rendered without tools)");
    bool thinking = true;  // the template's default; a record's chat_template_kwargs may set it
    if (r.contains("chat_template_kwargs") && !r.at("chat_template_kwargs").is_null()) {
      const json& kw = r.at("chat_template_kwargs");
      check(kw.is_object(), at + ": \"chat_template_kwargs\" must be an object");
      for (const auto& [key, v] : kw.items()) {
        check(key == "enable_thinking" && v.is_boolean(),
              at + ": chat_template_kwargs." + key +
                  " is not supported (Qwen3's template takes enable_thinking, true or false)");
        thinking = v.get<bool>();
      }
    }
    const auto render = [&](const std::vector<ChatMessage>& completion) {
      std::vector<ChatMessage> all = p;
      all.insert(all.end(), completion.begin(), completion.end());
      return encode(tok, qwen3_chat_format(all, false, thinking));
    };
    prompt = encode(tok, qwen3_chat_format(p, true, thinking));
    with_chosen = render(c);
    with_rejected = render(j);
  } else {
    std::string p, c = chosen.get<std::string>(), j = rejected.get<std::string>();
    if (r.contains("prompt")) {
      kind(r.at("prompt"), "prompt");
      p = r.at("prompt").get<std::string>();
    } else {  // trl.extract_prompt on strings: the common prefix of characters (code points,
              // not bytes), a space before the first difference going with the completions
      const auto char_start = [&](size_t k) {  // back from a UTF-8 continuation byte
        while (k > 0 && (static_cast<unsigned char>(c[k]) & 0xC0) == 0x80) --k;
        return k;
      };
      const size_t n = std::min(c.size(), j.size());
      size_t k = 0;
      while (k < n && c[k] == j[k]) ++k;
      if (k < n) {
        k = char_start(k);
        if (k > 0 && c[k - 1] == ' ') --k;
      } else if (n > 0) {
        k = char_start(n - 1);  // no difference: TRL's loop stops at the last character
      }
      p = c.substr(0, k);
      c.erase(0, k);
      j.erase(0, k);
    }
    check(!p.empty(), at + ": the preference record has an empty prompt");
    check(!c.empty() && !j.empty(),
          at + ": \"" + (c.empty() ? "chosen" : "rejected") + "\" is empty");
    prompt = encode(tok, p);
    with_chosen = encode(tok, p + c);
    with_rejected = encode(tok, p + j);
    // TRL appends the EOS text unless a completion ends with it: as an added token it is one id
    if (const auto eos = tok.eos_id())
      for (auto* v : {&with_chosen, &with_rejected})
        if (v->back() != *eos) v->push_back(*eos);
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
  read_json_records(o, &st.source,
                    [&](const json& j, const std::string& at, const std::string& what) {
                      PreferencePair p;
                      try {
                        p = preference_pair(j, tok, at);
                      } catch (const Error& e) {
                        if (!o.skip_malformed) throw Error(e.what() + skip_malformed_hint(o, what));
                        if (st.bad_records++ == 0) st.first_bad = at;
                        return;
                      }
                      ++st.records;
                      // TRL's max_length with truncation_mode keep_start: a pair whose prompt fills
                      // it is left out; each completion is cut so that prompt + completion keep
                      // their first max_tokens ids.
                      if (max_tokens > 0) {
                        const auto room = max_tokens - static_cast<int64_t>(p.prompt.size());
                        if (room <= 0) {
                          if (st.dropped_long++ == 0) st.first_dropped = at;
                          return;
                        }
                        bool cut = false;
                        for (auto* c : {&p.chosen, &p.rejected})
                          if (static_cast<int64_t>(c->size()) > room) {
                            c->resize(static_cast<size_t>(room));
                            cut = true;
                          }
                        st.truncated += cut ? 1 : 0;
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
                (st.dropped_long > 0 ? " (" + std::to_string(st.dropped_long) +
                                           " whose prompt alone fills training.seq_len + 1 "
                                           "tokens left out, first " +
                                           st.first_dropped + ")"
                                     : "") +
                "; point " + o.section + ".dataset_path at records of \"prompt\", \"chosen\", " +
                "\"rejected\"");
  }
  return pairs;
}

}  // namespace titan::data
