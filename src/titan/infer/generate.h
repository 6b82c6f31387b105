// titan generate: text from a model (a Hugging Face directory, a titan checkpoint or an HF
// export) with a key/value cache: each prompt is prefilled in one pass (in pieces of at most the
// model's tokens per call), then every unfinished prompt advances one token per step, all in one
// forward (prompts of different lengths share the step). A prompt ends at an EOS id
// (generation_config.json's eos_token_id, one or a list; else config.json's; else the
// tokenizer's) or after max_new_tokens. One prompt streams its text to stdout as tokens arrive;
// the end prints prefill and decode tokens/s.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/infer/sampling.h"

namespace titan::infer {

// A model directory's generation_config.json, each field checked as it is read (Transformers'
// GenerationConfig refuses the same values): temperature >= 0, top_p in (0, 1], top_k a whole
// number >= 0, do_sample a boolean, eos_token_id a token id or a list of them. titan::Error names
// the file and the field. Absent or null fields stay unset.
struct GenerationConfig {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  bool do_sample = false;
  std::optional<std::vector<int64_t>> eos;  // checked against the vocabulary when used
};
GenerationConfig read_generation_config(const std::string& path);
// The "eos_token_id" of a JSON file (a config.json): nullopt when the file or the field is
// absent; titan::Error naming the file when it is not a token id or a list of them.
std::optional<std::vector<int64_t>> read_eos_token_id(const std::string& path);

struct GenerateOptions {
  std::string prompt;        // --prompt TEXT
  std::string prompts_file;  // --prompts_file F.jsonl: records with "text", "ids" or "messages"
  std::string output;        // --output F.jsonl: one record per prompt
  bool chat = false;         // --chat: Qwen3's chat template around text prompts
  std::string system;        // --system TEXT (with --chat)
  bool enable_thinking = false;
  int64_t max_new_tokens = 64;
  std::optional<double> temperature, top_p;  // unset: generation_config.json's, else 1
  std::optional<int64_t> top_k;              // unset: generation_config.json's, else off
  bool greedy = false;                       // --greedy, or generation_config do_sample false
  std::optional<uint64_t> seed;              // unset: debug.seed, else 0
  bool ignore_eos = false;
  bool quiet = false;  // no streaming (tests)
};

// Parses generate's own flags out of args (leaving the config flags); throws titan::Error
// naming a bad flag or value.
GenerateOptions take_generate_flags(std::vector<std::string>& args);

struct Completion {
  std::vector<int32_t> prompt_ids, ids;
  std::string text;
  std::string finish;  // "eos" or "length"
};
struct GenerateResult {
  std::vector<Completion> completions;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0;
};

GenerateResult generate(const config::JobConfig& cfg, const GenerateOptions& o);

// The model checks of a config for generation: training.seq_len does not apply (generate sizes
// the model to the longest prompt + max_new_tokens and checks that against the context).
void validate_generate_config(const config::JobConfig& cfg);

}  // namespace titan::infer
