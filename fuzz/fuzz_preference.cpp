// Fuzzes the preference records reader (dpo.enable): JSON lines of prompt / chosen / rejected,
// conversational or plain, with and without a prompt (malformed lines and records, wrong and
// mixed types, empty fields, chat_template_kwargs, invalid UTF-8, a file holding one JSON array),
// tokenized with the byte tokenizer and cut to a short length, each pair then laid out as the
// rows DPO trains on.
#include "fuzz_util.h"
#include "titan/data/preference.h"
#include "titan/train/dpo.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "pairs.jsonl");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::data::SourceOptions o;
    o.dataset = "jsonl";
    o.path = path;
    const auto tok = titan::data::make_tokenizer("byte");
    for (bool skip : {false, true}) {
      o.skip_malformed = skip;
      for (const auto& p : titan::data::read_preference_pairs(o, *tok, 33)) {
        if (p.prompt.size() + p.chosen.size() > 33 || p.prompt.size() + p.rejected.size() > 33 ||
            p.chosen.empty() || p.rejected.empty())
          __builtin_trap();  // cut to max_tokens, never empty
        for (const auto* c : {&p.chosen, &p.rejected}) {
          const auto row = titan::train::sequence_row(p.prompt, *c, 2);
          if (row.input.size() % 2 != 0 || row.completion_tokens != static_cast<int64_t>(c->size()))
            __builtin_trap();
        }
      }
    }
  });
}
