// torchtitan's metrics: the console line and a JSONL record per logged step.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace titan::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double memory_gib = 0, memory_pct = 0;
  double tps = 0, tflops = 0, mfu = 0;
  double step_time = 0, data_loading_time = 0;
  int64_t n_tokens_seen = 0;
};

// "step:  1  loss:  7.62461  grad_norm:  1.2345  memory:  0.52GiB(2.17%)  tps: 1,234  tflops: 0.12
// mfu: 1.23%"
std::string format_console(const StepMetrics& m, bool color);
std::string format_jsonl(const StepMetrics& m);
// 1234567 -> "1,234,567"
std::string with_commas(int64_t v);

class MetricsWriter {
 public:
  // jsonl_path empty: no file. The file is opened for append (a resumed run continues it).
  MetricsWriter(const std::string& jsonl_path, bool color);
  void log(const StepMetrics& m);

 private:
  std::ofstream jsonl_;
  bool color_;
};

}  // namespace titan::train
