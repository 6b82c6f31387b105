// Logging in torchtitan's console format: "[titan] 2026-11-29 14:00:00,123 - root - INFO - msg".
#pragma once
#include <string>

namespace titan::log {

void info(const std::string& msg);
void warn(const std::string& msg);
// Colors on the console (torchtitan's metrics colors): off when disabled
// (metrics.disable_color_printing), with NO_COLOR set, when stdout is not a terminal, and under
// mpirun unless FORCE_COLOR is set.
void set_color(bool enabled);
// Multi-rank runs (set once at start): info lines come from rank 0 only; warnings from every rank,
// prefixed "[rank R]".
void set_rank(int rank, int world);
bool color();
// Whether info lines print here (rank 0).
bool prints_info();
// A progress line on an interactive console: "\r[titan] ... msg" rewritten in place (done:
// ends the line). Rank 0 only.
void progress_line(const std::string& msg, bool done);
// Whether stdout is an interactive terminal (not under mpirun, whose ranks write to
// pseudo-terminals whatever the job's output is).
bool interactive();

}  // namespace titan::log
