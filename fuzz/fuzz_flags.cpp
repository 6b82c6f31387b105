// Fuzzes the dotted command-line flags: the input split at newlines into argv entries
// (--section.field value, --flag=value, booleans, lists), applied over qwen3_debugmodel, then
// validated.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/config/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  args.push_back(cur);
  return titan::fuzz::expect_error_or_ok([&] {
    static const bool registered = (titan::config::register_builtin_configs(), true);
    (void)registered;
    titan::config::JobConfig c = titan::config::make_config("qwen3_debugmodel");
    titan::config::apply_flags(c, args);
    titan::config::validate(c);
  });
}
