// torchtitan's metrics: the console line, a JSONL record per logged step, and TensorBoard
// scalars (metrics.enable_tensorboard).
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/file_io.h"
#include "titan/train/tensorboard.h"

namespace titan::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
  double memory_gib = 0, memory_pct = 0;
  double tps = 0, tflops = 0, mfu = 0;
  double step_time = 0, data_loading_time = 0;
  int64_t n_tokens_seen = 0;
  // MoE: the auxiliary load-balancing loss (NaN when off) and, per MoE layer, the fewest and
  // most tokens any expert received in the step (JSONL only).
  double aux_loss = std::nan("");
  struct ExpertLoad {
    int64_t layer = 0;
    double min = 0, max = 0;
  };
  std::vector<ExpertLoad> expert_load;
  // The objective's own metrics under their usual names (DPO: TRL's rewards/… and logps/…):
  // console (rewards/accuracies and rewards/margins), JSONL and TensorBoard.
  std::vector<std::pair<std::string, double>> objective;
};

// "step:  1  loss:  7.62461  grad_norm:  1.2345  memory:  0.52GiB(2.17%)  tps: 1,234  tflops: 0.12
// mfu: 1.23%"
std::string format_console(const StepMetrics& m, bool color);
std::string format_jsonl(const StepMetrics& m);
// 1234567 -> "1,234,567"
std::string with_commas(int64_t v);

// One validation (validator.*): torchtitan's "validate step:" line and a JSONL record
// {"step", "validation_loss", "validation_tokens", "validation_tps", "memory_gib", "memory_pct"}.
struct ValidationMetrics {
  int64_t step = 0;
  double loss = 0;
  int64_t tokens = 0;
  double tps = 0, memory_gib = 0, memory_pct = 0;
};
// "validate step:  2  loss:  7.6246  memory:  0.52GiB(2.17%)  tps: 1,234"
std::string format_validation_console(const ValidationMetrics& m, bool color);
std::string format_validation_jsonl(const ValidationMetrics& m);

class MetricsWriter {
 public:
  // jsonl_path empty: no file. The file is opened for append: a resumed run continues it. The
  // records of steps after start_step (written by the run this one resumes, after its
  // checkpoint, or by an earlier run in the same folder; and a line cut short by a kill) are
  // dropped first (the file rewritten through a temporary name), so no step appears twice.
  // tb_dir non-empty: also TensorBoard event files there (train/tensorboard.h) with torchtitan's
  // tags; a folder that cannot be made is an error here, a write that fails later is reported
  // once and TensorBoard is off for the rest of the run (training goes on).
  MetricsWriter(const std::string& jsonl_path, bool color, int64_t start_step = 0,
                const std::string& tb_dir = "");
  ~MetricsWriter();
  // Each record is appended whole or not at all: a failed write (a full disk) truncates the file
  // back and throws titan::Error naming it.
  void log(const StepMetrics& m);
  void log_validation(const ValidationMetrics& m);

 private:
  void append(const std::string& line, int64_t step);
  void tb(const std::vector<std::pair<std::string, double>>& scalars, int64_t step);
  io::AppendFile jsonl_;
  std::unique_ptr<TensorBoardWriter> tb_;
  bool color_;
};

// Drops the records of `path` whose step is past start_step, and any incomplete or malformed
// line; rewrites the file (temporary name, then rename) only when something is dropped.
// Returns the number of lines dropped.
int64_t trim_metrics(const std::string& path, int64_t start_step);

}  // namespace titan::train
