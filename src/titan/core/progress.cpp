#include "titan/core/progress.h"

#include <cmath>
#include <cstdio>

#include "titan/core/cpu.h"
#include "titan/core/log.h"

namespace titan {
namespace {
std::string amount(double v, bool bytes, const std::string& items) {
  char b[64];
  if (bytes)
    std::snprintf(b, sizeof b, "%.2f GB", v / 1e9);
  else
    std::snprintf(b, sizeof b, "%.0f %s", v, items.c_str());
  return b;
}
}  // namespace

Progress::Progress(std::string what, int64_t total, bool bytes, std::string items, double quiet_s)
    : what_(std::move(what)),
      items_(std::move(items)),
      total_(total),
      bytes_(bytes),
      quiet_s_(quiet_s),
      start_(cpu::now_seconds()),
      tty_(log::interactive()) {}

std::string Progress::line(int64_t done, double elapsed) const {
  const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 0;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  char b[128];
  std::snprintf(b, sizeof b, " (%.0f%%), %s/s", 100 * frac, amount(rate, bytes_, items_).c_str());
  std::string s = what_ + ": " + amount(static_cast<double>(done), bytes_, items_) + " / " +
                  amount(static_cast<double>(total_), bytes_, items_) + b;
  if (rate > 0 && done < total_)
    s +=
        ", " +
        std::to_string(static_cast<int64_t>(std::ceil(static_cast<double>(total_ - done) / rate))) +
        " s left";
  return s;
}

void Progress::add(int64_t n) {
  const int64_t done = done_ += n;
  if (!log::prints_info() || total_ <= 0) return;
  const double now = cpu::now_seconds(), elapsed = now - start_;
  if (elapsed < quiet_s_) return;
  std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (tty_) {
    if (now - last_ < 0.25) return;
    last_ = now;
    shown_ = true;
    log::progress_line(line(done, elapsed), false);
  } else {
    const int d = static_cast<int>(10 * done / total_);
    if (d <= decile_) return;
    decile_ = d;
    shown_ = true;
    log::info(line(done, elapsed));
  }
}

Progress::~Progress() {
  if (!shown_) return;
  const double elapsed = cpu::now_seconds() - start_;
  char b[64];
  std::snprintf(b, sizeof b, ", done in %.1f s", elapsed);
  const std::string s = line(done_, elapsed) + b;
  if (tty_)
    log::progress_line(s, true);
  else if (decile_ < 10)
    log::info(s);
}

}  // namespace titan
