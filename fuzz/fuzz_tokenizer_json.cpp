// Fuzzes the tokenizer.json loader (model, pre-tokenizer regexes, added tokens, merges,
// normalizer, post-processor), then one encode and decode with what it loaded.
#include "fuzz_util.h"
#include "titan/data/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "tokenizer.json");
  return titan::fuzz::expect_error_or_ok([&] {
    const auto tok = titan::data::HfTokenizer::load(path);
    const auto ids = tok.encode("Hello, world! 123 héllo\n  tabs\tend", true, true);
    (void)tok.decode(ids);
  });
}
