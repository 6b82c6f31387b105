// Fuzzes the PEFT adapter_config.json reader (models/lora.h, read_adapter_config), then the
// target_modules list it yields (lora_target_leaves).
#include "fuzz_util.h"
#include "titan/models/lora.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "adapter_config.json");
  return titan::fuzz::expect_error_or_ok([&] {
    titan::models::LoraOptions o;
    titan::models::read_adapter_config(path, &o);
    titan::models::lora_target_leaves(o.target_modules);
  });
}
