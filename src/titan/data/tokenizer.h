// One interface over the tokenizers a data pipeline can use: the byte-level tokenizer (no files)
// and a Hugging Face tokenizer.json (HfTokenizer). encode() is torchtitan's
// tokenizer.encode(text, add_bos, add_eos): BOS/EOS only when the tokenizer has them.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids are in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // Appends the ids of text to *out. Const and thread-safe.
  virtual void encode(std::string_view text, bool add_bos, bool add_eos,
                      std::vector<int32_t>* out) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // "byte", or the path of the tokenizer.json.
  virtual std::string name() const = 0;
};

// spec: "byte", or a directory holding tokenizer.json (and tokenizer_config.json), or the
// tokenizer.json itself. Throws titan::Error naming dataloader.tokenizer for a missing path.
std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace titan::data
