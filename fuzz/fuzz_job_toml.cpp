// Fuzzes a TOML job file (--job.config_file) applied over qwen3_debugmodel, then the config's
// validation: tables, value types, unknown keys, nested config_file.
#include "fuzz_util.h"
#include "titan/config/builtin_configs.h"
#include "titan/config/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "job.toml");
  return titan::fuzz::expect_error_or_ok([&] {
    static const bool registered = (titan::config::register_builtin_configs(), true);
    (void)registered;
    titan::config::JobConfig c = titan::config::make_config("qwen3_debugmodel");
    titan::config::apply_toml_file(c, path);
    titan::config::validate(c);
  });
}
