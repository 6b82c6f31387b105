// torchtitan's warmup-stable-decay LR multiplier (LambdaLR over a 0-indexed scheduler step s;
// training step N uses s = N-1):
//   decay = round(total·decay_ratio), at most total − warmup (or total − warmup when unset);
//   stable = total + 1 − warmup − decay
//   s < warmup            -> (s+1)/warmup
//   s < warmup + stable   -> 1
//   else p = (s+1 − (warmup+stable))/decay: linear 1−p, sqrt 1−√p, cosine ½(1+cos πp),
//        then min_lr_factor + (1−min_lr_factor)·f
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace titan::optim {

struct LRSchedule {
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::optional<double> decay_ratio;
  std::string decay_type = "linear";  // linear | sqrt | cosine
  double min_lr_factor = 0.0;

  double factor(int64_t s) const;  // multiplier for scheduler step s (0-based)
};

}  // namespace titan::optim
