#include "titan/train/step_in_backward.h"

#include <algorithm>
#include <cmath>

namespace titan::train {

void add_sum_squares(const optim::Kernels& k, const float* g, int64_t begin, int64_t end,
                     const std::vector<models::FlatRange>& replicated, double sq[2]) {
  int64_t at = begin;
  for (const auto& rep : replicated) {
    const int64_t lo = std::max(rep.begin, begin), hi = std::min(rep.begin + rep.len, end);
    if (lo >= hi) continue;
    sq[0] += k.sum_squares(g + at, lo - at);
    sq[1] += k.sum_squares(g + lo, hi - lo);
    at = hi;
  }
  sq[0] += k.sum_squares(g + at, end - at);
}

StepInBackward::StepInBackward(models::ParamStore& store, optim::AdamWState& state,
                               const optim::Kernels& k, const optim::AdamWConfig& c,
                               dist::Communicator* replicate,
                               std::vector<models::FlatRange> replicated)
    : store_(store),
      state_(state),
      k_(k),
      c_(c),
      replicate_(replicate),
      replicated_(std::move(replicated)) {}

void StepInBackward::begin_step(float lr, int64_t step, uint64_t key, uint64_t weight_key) {
  lr_ = lr;
  step_ = step;
  key_ = key;
  weight_key_ = weight_key;
  sq_[0] = sq_[1] = 0;
  updated_ = 0;
  failed_ = false;
}

void StepInBackward::acquire(int64_t u, bool backward) {
  // Memory behind the gradients this pass writes, before it writes them (host pages in one call):
  // a layer's in its backward; the head's in its forward (fused with its backward), and the
  // embedding's when the head acquires it there (a tied lm_head). An untied embedding's backward
  // acquires nothing: its few rows fault in as written.
  const int64_t head = static_cast<int64_t>(store_.units().size()) - 1;
  const bool with_head = !backward && backward_follows_ && (u == head || (u == 0 && head_seen_));
  if (!backward && u == head) head_seen_ = true;
  if (backward || with_head) {
    const models::ParamUnit& r = store_.units()[static_cast<size_t>(u)];
    store_.hold(models::ParamStore::Flat::grads, r.begin, r.end - r.begin);
  }
}

void StepInBackward::grads_ready(int64_t u) {
  const models::ParamUnit& r = store_.units()[static_cast<size_t>(u)];
  const bool done = apply(store_.update_begin(u), store_.grads(), r.begin, r.end - r.begin);
  store_.update_end(u, weight_key_);
  if (done) store_.give_back(models::ParamStore::Flat::grads, r.begin, r.end - r.begin);
}

void StepInBackward::shard_ready(float* p, float* g, int64_t at, int64_t len) {
  apply(p, g, at, len);
}

bool StepInBackward::apply(float* p, float* g, int64_t at, int64_t len) {
  if (failed_) return false;
  if (replicate_ && replicate_->size() > 1) replicate_->all_reduce(g + at, len);
  double s[2] = {0, 0};
  add_sum_squares(k_, g, at, at + len, replicated_, s);
  if (!std::isfinite(s[0] + s[1])) {
    failed_ = true;
    return false;
  }
  sq_[0] += s[0];
  sq_[1] += s[1];
  state_.step_range(k_, p, g, at, len, c_, lr_, step_, key_);
  ++updated_;
  return true;
}

}  // namespace titan::train
