// Progress of long work (loading or writing a large checkpoint, tokenizing a corpus, the GEMM
// probe): nothing for work that ends within `quiet_s` seconds (2); after that, on an interactive
// console one line rewritten in place at most 4 times a second ("loading X: 1.20 / 2.38 GB
// (50%), 1.10 GB/s, 1 s left"), and when the output is not a terminal one log line per 10%
// crossed, so logs stay readable. Rank 0 only. add() may be called from any thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace titan {

class Progress {
 public:
  // total: units of work (bytes when bytes = true, else items named by `items`).
  Progress(std::string what, int64_t total, bool bytes = true, std::string items = "items",
           double quiet_s = 2.0);
  ~Progress();  // a last line ("... done in 3.2 s") if anything was shown
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void add(int64_t n);

 private:
  std::string line(int64_t done, double elapsed) const;
  std::string what_, items_;
  int64_t total_;
  bool bytes_;
  double quiet_s_, start_;
  std::atomic<int64_t> done_{0};
  std::mutex m_;  // printing (try_lock: workers never wait)
  double last_ = 0;
  int decile_ = 0;
  bool shown_ = false, tty_;
};

}  // namespace titan
