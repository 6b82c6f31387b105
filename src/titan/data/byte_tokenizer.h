// Byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then BOS, EOS and pad. Used until the
// Hugging Face tokenizer lands; needs no files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256, kEos = 257, kPad = 258;
  int64_t vocab_size() const { return 259; }
  int32_t bos_id() const { return kBos; }
  int32_t eos_id() const { return kEos; }
  // Appends [BOS] + bytes + [EOS] (as torchtitan's encode(add_bos=True, add_eos=True)).
  void encode(std::string_view text, bool add_bos, bool add_eos, std::vector<int32_t>* out) const;
  // Bytes back; special ids are dropped.
  std::string decode(const std::vector<int32_t>& ids) const;
};

}  // namespace titan::data
