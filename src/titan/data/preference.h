// Preference data for DPO (config dpo.enable), in TRL's preference formats, one JSON object a
// line (or the elements of a .json file holding one array):
//   {"prompt": [messages], "chosen": [messages], "rejected": [messages]}   conversational
//   {"chosen": [messages], "rejected": [messages]}   conversational with an implicit prompt: the
//       messages both share from the start are the prompt
//   {"prompt": "text", "chosen": "text", "rejected": "text"}   plain text
// tokenized as TRL's DPOTrainer tokenizes them (see preference.cpp for the exact rule).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"

namespace titan::data {

// One tokenized pair: TRL's prompt_input_ids, chosen_input_ids and rejected_input_ids.
struct PreferencePair {
  std::vector<int32_t> prompt, chosen, rejected;
};

// One record's pair; `at` (file:line) names it in errors (a missing or empty field, a field of
// the wrong kind, messages that are not chat messages).
PreferencePair preference_pair(const nlohmann::json& record, const Tokenizer& tok,
                               const std::string& at);

// What reading found, for the one-line report.
struct PreferenceStats {
  SourceStats source;
  int64_t records = 0, bad_records = 0;
  int64_t truncated = 0, dropped_long = 0;  // pairs cut to max_tokens; prompts filling it
  std::string first_bad, first_dropped;     // file:line
};

// Every record of o.path as a pair, cut to max_tokens ids as TRL's max_length with truncation_mode
// keep_start cuts (prompt + each completion keep their first max_tokens ids; a pair whose prompt
// alone fills them is left out and counted). Throws titan::Error for malformed records
// (file:line; skipped and counted under skip_malformed) and for a source without pairs.
std::vector<PreferencePair> read_preference_pairs(const SourceOptions& o, const Tokenizer& tok,
                                                  int64_t max_tokens,
                                                  PreferenceStats* stats = nullptr);

}  // namespace titan::data
