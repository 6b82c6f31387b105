// Fuzzes the checks a plugin file passes before dlopen maps it (plugin/registry.h,
// check_plugin_file): arbitrary bytes as a .so -> a titan::Error naming the cause, or a pass.
// dlopen itself is never called here: the checks must hold on any input.
#include "fuzz_util.h"
#include "titan/plugin/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "plugin.so");
  return titan::fuzz::expect_error_or_ok([&] { titan::plugin::check_plugin_file(path, path); });
}
