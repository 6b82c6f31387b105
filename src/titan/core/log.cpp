#include "titan/core/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace titan::log {
namespace {
bool set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// Colour only for a person at a terminal: never with NO_COLOR; always with FORCE_COLOR; under
// mpirun (whose launcher makes each rank's stdout a pseudo-terminal, though the job's output is
// usually a file) only when asked with FORCE_COLOR; else when stdout is a terminal.
bool under_mpirun() { return set("OMPI_COMM_WORLD_SIZE") || set("PMIX_RANK") || set("PMI_RANK"); }

bool color_wanted() {
  if (set("NO_COLOR")) return false;
  if (set("FORCE_COLOR")) return true;
  return !under_mpirun() && isatty(STDOUT_FILENO) != 0;
}

bool g_color = color_wanted();
int g_rank = 0, g_world = 1;

std::string stamp_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s,%03d", stamp, ms);
  return out;
}

void emit(const char* level, const std::string& msg) {
  std::printf("[titan] %s - root - %s - %s\n", stamp_now().c_str(), level, msg.c_str());
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
void set_color(bool enabled) { g_color = enabled && color_wanted(); }
bool color() { return g_color; }
bool prints_info() { return g_rank == 0; }
bool interactive() { return !under_mpirun() && isatty(STDOUT_FILENO) != 0; }
void progress_line(const std::string& msg, bool done) {
  if (g_rank != 0) return;
  // \033[K clears what a longer earlier line left.
  std::printf("\r[titan] %s - root - INFO - %s\033[K%s", stamp_now().c_str(), msg.c_str(),
              done ? "\n" : "");
  std::fflush(stdout);
}

}  // namespace titan::log
