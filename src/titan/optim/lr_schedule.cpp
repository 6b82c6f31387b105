#include "titan/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "titan/core/error.h"

namespace titan::optim {

double LRSchedule::factor(int64_t s) const {
  const int64_t warmup = std::min(warmup_steps, total_steps);
  int64_t decay = total_steps - warmup;
  if (decay_ratio) {
    // Python round(): half to even. torchtitan cuts the decay so warmup + decay fit the total.
    decay = static_cast<int64_t>(std::nearbyint(static_cast<double>(total_steps) * *decay_ratio));
    if (warmup + decay > total_steps) decay = total_steps - warmup;
  }
  const int64_t stable = total_steps + 1 - warmup - decay;
  if (s < warmup) return static_cast<double>(s + 1) / static_cast<double>(warmup);
  if (s < warmup + stable) return 1.0;
  const double p = static_cast<double>(s + 1 - (warmup + stable)) / static_cast<double>(decay);
  double f;
  if (decay_type == "linear")
    f = 1.0 - p;
  else if (decay_type == "sqrt")
    f = 1.0 - std::sqrt(p);
  else if (decay_type == "cosine")
    f = 0.5 * (1.0 + std::cos(M_PI * p));
  else
    throw Error("lr_scheduler.decay_type '" + decay_type + "' is not one of linear, sqrt, cosine");
  return min_lr_factor + (1.0 - min_lr_factor) * f;
}

}  // namespace titan::optim
