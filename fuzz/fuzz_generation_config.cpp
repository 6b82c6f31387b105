// Fuzzes the generation_config.json reader (infer/generate.h, read_generation_config): JSON text
// -> sampling fields and EOS ids, every field's type and range checked.
#include "fuzz_util.h"
#include "titan/infer/generate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "generation_config.json");
  return titan::fuzz::expect_error_or_ok([&] { titan::infer::read_generation_config(path); });
}
