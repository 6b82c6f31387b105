// Plugins that misbehave, for the loader's error tests. Each is built as its own library with one
// of the macros below defined.
#include <stdexcept>

#include "titan/plugin/plugin_api.h"

#if defined(TITAN_TEST_BAD_VERSION)
extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION + 998; }
extern "C" void titan_plugin_register(titan::plugin::Host*) {}
#elif defined(TITAN_TEST_NO_REGISTER)
extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }
#elif defined(TITAN_TEST_THROWS_NON_STD)
// Registration throws something that is not a std::exception.
extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }
extern "C" void titan_plugin_register(titan::plugin::Host*) { throw 42; }
#elif defined(TITAN_TEST_CRASHING_KERNEL)
// A RoPE kernel whose forward writes through a null pointer, attached to every layer.
extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }
extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  titan::ops::RopeOp op;
  op.name = "crashing_rope";
  op.forward = [](float* x, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                  const float*) {
    volatile float* null = nullptr;
    *null = x[0];
  };
  op.backward = op.forward;
  host->add_op(op);
  host->add_module_type({"CrashingRoPE.Config", {"RoPE.Config"}, {{"op", "crashing_rope"}}});
  titan::plugin::Override ov;
  ov.name = "crashing_rope";
  ov.target = "RoPE.Config";
  ov.factory = [host](const titan::config::ModuleNode& n) {
    return titan::config::derive(n, host->module_type("CrashingRoPE.Config"),
                                 {{"op", "crashing_rope"}});
  };
  host->add_override(ov);
}
#elif defined(TITAN_TEST_THROWING_KERNEL)
// A RoPE kernel whose forward throws, attached to every layer.
extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }
extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  titan::ops::RopeOp op;
  op.name = "throwing_rope";
  op.forward = [](float*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                  const float*) { throw std::runtime_error("throwing_rope: device fault"); };
  op.backward = op.forward;
  host->add_op(op);
  host->add_module_type({"ThrowingRoPE.Config", {"RoPE.Config"}, {{"op", "throwing_rope"}}});
  titan::plugin::Override ov;
  ov.name = "throwing_rope";
  ov.target = "RoPE.Config";
  ov.factory = [host](const titan::config::ModuleNode& n) {
    return titan::config::derive(n, host->module_type("ThrowingRoPE.Config"),
                                 {{"op", "throwing_rope"}});
  };
  host->add_override(ov);
  // And a config function, to show --module registering one.
  host->add_config("throwing_debugmodel", [] {
    titan::config::JobConfig c;
    c.training.seq_len = 64;
    c.training.local_batch_size = 1;
    c.model.n_layers = 1;
    return c;
  });
}
#endif
