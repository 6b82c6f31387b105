// Fuzzes the Hugging Face config.json reader: JSON text -> Qwen3Args (every field's type and
// range checked, MoE fields, rope_scaling, head_dim defaults), then the args' own validation.
#include "fuzz_util.h"
#include "nlohmann/json.hpp"
#include "titan/models/qwen3/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "config.json");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::qwen3::Qwen3Args a = titan::qwen3::args_from_hf_config(path);
    a.validate();
  });
}
