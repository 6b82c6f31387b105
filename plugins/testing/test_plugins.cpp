// Plugins that misbehave, for the loader's error tests. Each is built as its own library with one
// of the macros below defined.
#include <stdexcept>
#include <string>

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
#elif defined(TITAN_TEST_CRASHING_KERNEL) || defined(TITAN_TEST_THROWING_KERNEL)
namespace {
// Registers a RoPE op `name` whose forward and backward are `fn`, a module type `type` using it,
// and an override that puts it on every layer.
void attach_rope_everywhere(titan::plugin::Host* host, const std::string& name,
                            const std::string& type, decltype(titan::ops::RopeOp::forward) fn) {
  titan::ops::RopeOp op;
  op.name = name;
  op.forward = fn;
  op.backward = fn;
  host->add_op(op);
  host->add_module_type({type, {"RoPE.Config"}, {{"op", name}}});
  titan::plugin::Override ov;
  ov.name = name;
  ov.target = "RoPE.Config";
  ov.factory = [host, name, type](const titan::config::ModuleNode& n) {
    return titan::config::derive(n, host->module_type(type), {{"op", name}});
  };
  host->add_override(ov);
}
}  // namespace

extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }
#if defined(TITAN_TEST_CRASHING_KERNEL)
// A RoPE kernel whose forward writes through a null pointer, attached to every layer.
extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  attach_rope_everywhere(
      host, "crashing_rope", "CrashingRoPE.Config",
      [](float* x, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const float*) {
        volatile float* null = nullptr;
        *null = x[0];
      });
}
#else
// A RoPE kernel whose forward throws, attached to every layer.
extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  attach_rope_everywhere(
      host, "throwing_rope", "ThrowingRoPE.Config",
      [](float*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const float*) {
        throw std::runtime_error("throwing_rope: device fault");
      });
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
#endif
