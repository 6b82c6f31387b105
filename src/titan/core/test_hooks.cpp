#include "titan/core/test_hooks.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace titan::test {
namespace {

struct Target {
  std::string name;
  long when = 1;  // the visit that dies
  long seen = 0;
};

Target* target() {
  static Target* t = [] {
    const char* env = std::getenv("TITAN_TEST_KILL_AT");
    if (!env || !*env) return static_cast<Target*>(nullptr);
    auto* r = new Target;
    r->name = env;
    if (auto at = r->name.find('@'); at != std::string::npos) {
      r->when = std::atol(r->name.c_str() + at + 1);
      r->name.resize(at);
    }
    return r;
  }();
  return t;
}

}  // namespace

bool kill_due(const char* name) {
  Target* t = target();
  return t && t->name == name && ++t->seen == t->when;
}

bool disabled(const char* feature) {
  const char* env = std::getenv("TITAN_TEST_DISABLE");
  if (!env || !*env) return false;
  const std::string_view want(feature);
  std::string_view list(env);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    if (list.substr(0, comma) == want) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

void kill_now() {
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

}  // namespace titan::test
