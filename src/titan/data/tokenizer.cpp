#include "titan/data/tokenizer.h"

#include <filesystem>

#include "titan/core/error.h"
#include "titan/data/byte_tokenizer.h"
#include "titan/data/hf_tokenizer.h"

namespace titan::data {
namespace {

class Byte final : public Tokenizer {
 public:
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  std::optional<int32_t> bos_id() const override { return tok_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return tok_.eos_id(); }
  void encode(std::string_view text, bool add_bos, bool add_eos,
              std::vector<int32_t>* out) const override {
    tok_.encode(text, add_bos, add_eos, out);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  std::string name() const override { return "byte"; }

 private:
  ByteTokenizer tok_;
};

class Hf final : public Tokenizer {
 public:
  explicit Hf(HfTokenizer tok) : tok_(std::move(tok)) {}
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  std::optional<int32_t> bos_id() const override { return tok_.bos_id(); }
  std::optional<int32_t> eos_id() const override { return tok_.eos_id(); }
  void encode(std::string_view text, bool add_bos, bool add_eos,
              std::vector<int32_t>* out) const override {
    tok_.encode_into(text, add_bos, add_eos, out);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  std::string name() const override { return tok_.path(); }

 private:
  HfTokenizer tok_;
};

}  // namespace

std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_shared<Byte>();
  std::error_code ec;
  check(!spec.empty() && std::filesystem::exists(spec, ec),
        "dataloader.tokenizer '" + spec +
            "' is neither 'byte' nor an existing tokenizer.json or directory holding one");
  return std::make_shared<Hf>(HfTokenizer::load(spec));
}

}  // namespace titan::data
