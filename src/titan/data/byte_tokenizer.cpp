#include "titan/data/byte_tokenizer.h"

namespace titan::data {

void ByteTokenizer::encode(std::string_view text, bool add_bos, bool add_eos,
                           std::vector<int32_t>* out) const {
  if (add_bos) out->push_back(kBos);
  for (unsigned char c : text) out->push_back(c);
  if (add_eos) out->push_back(kEos);
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids)
    if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  return s;
}

}  // namespace titan::data
