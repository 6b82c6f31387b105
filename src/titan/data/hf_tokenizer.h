// Hugging Face tokenizer.json byte-level BPE tokenizer (Qwen, GPT-2, Llama 3 style), native. It
// produces the ids the `tokenizers` library produces: added tokens are matched in the raw text
// first (leftmost-longest, with their lstrip/rstrip/single_word/normalized flags), the pieces
// between them are NFC-normalized (utf8proc), split by the pre-tokenizer regexes (PCRE2 with JIT,
// character classes widened to the Unicode tables of the library's Oniguruma), mapped to
// byte-level symbols and merged by rank. Special tokens of tokenizer_config.json are registered
// as torchtitan's HuggingFaceTokenizer does, and BOS/EOS follow its encode(add_bos, add_eos):
// added only when the tokenizer has them and its post-processor does not add them already.
// Encoding is const and thread-safe (each thread keeps its own BPE word cache, 2 MiB per
// tokenizer), so callers may encode documents in parallel, e.g. with OpenMP.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

class HfTokenizer {
 public:
  // dir_or_file: a directory holding tokenizer.json (and optionally tokenizer_config.json), or
  // the tokenizer.json file itself (its directory is searched for tokenizer_config.json).
  // Throws titan::Error naming the file and field for anything missing or unsupported.
  static HfTokenizer load(const std::string& dir_or_file);

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // torchtitan's HuggingFaceTokenizer.encode: the tokenizer's own ids (post-processor template
  // included), then BOS in front / EOS at the end when requested, when the tokenizer has them
  // and the post-processor does not add them itself. Invalid UTF-8 is first replaced as
  // bytes.decode("utf-8", errors="replace") would (see sanitize_utf8).
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const;
  // The same, appended to *out.
  void encode_into(std::string_view text, bool add_bos, bool add_eos,
                   std::vector<int32_t>* out) const;
  // Text of the ids, special tokens skipped (as tokenizers' decode(skip_special_tokens=True));
  // ids outside the vocabulary are skipped; invalid UTF-8 from partial tokens becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;

  // Max id + 1 over the model vocabulary and the added tokens.
  int64_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Added tokens first, then the model vocabulary (token strings in byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(const std::string& token) const;
  // Path of the tokenizer.json this was loaded from.
  const std::string& path() const;

  // s with every ill-formed UTF-8 sequence replaced by U+FFFD exactly as Python's
  // bytes.decode("utf-8", errors="replace") does (one U+FFFD per maximal invalid subpart);
  // *replaced (when not null) receives the number of replacements.
  static std::string sanitize_utf8(std::string_view s, int64_t* replaced);

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
