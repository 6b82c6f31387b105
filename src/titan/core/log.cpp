#include "titan/core/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace titan::log {
namespace {
bool g_color = isatty(STDOUT_FILENO) != 0;
int g_rank = 0, g_world = 1;

void emit(const char* level, const std::string& msg) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  std::printf("[titan] %s,%03d - root - %s - %s\n", stamp, ms, level, msg.c_str());
  std::fflush(stdout);
}
}  // namespace

void info(const std::string& msg) {
  if (g_rank == 0) emit("INFO", msg);
}
void warn(const std::string& msg) {
  emit("WARNING", g_world > 1 ? "[rank " + std::to_string(g_rank) + "] " + msg : msg);
}
void set_rank(int rank, int world) {
  g_rank = rank;
  g_world = world;
}
void set_color(bool enabled) { g_color = enabled && isatty(STDOUT_FILENO) != 0; }
bool color() { return g_color; }

}  // namespace titan::log
