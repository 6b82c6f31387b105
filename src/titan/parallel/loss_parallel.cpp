// Vocab-parallel lm_head + cross-entropy over a Communicator (loss_parallel.h).
#include "titan/parallel/loss_parallel.h"

namespace titan::parallel {

namespace {
class GroupReducer final : public ops::RankReducer {
 public:
  explicit GroupReducer(dist::Communicator& c) : c_(c) {}
  void sum(float* x, int64_t n) override { c_.all_reduce(x, n); }
  void max(float* x, int64_t n) override { c_.all_reduce(x, n, dist::ReduceOp::max); }

 private:
  dist::Communicator& c_;
};
}  // namespace

int64_t lm_head_ce_vocab_parallel_scratch(int64_t T, int64_t V_local, int64_t chunk_rows) {
  return ops::lm_head_ce_vocab_parallel_scratch(T, V_local, 0, chunk_rows, false);
}

ops::LossSum lm_head_ce_vocab_parallel(const float* h, const float* w_local, VocabShard shard,
                                       int64_t V, const int32_t* labels, int64_t T, int64_t D,
                                       int64_t chunk_rows, float grad_scale, float* dh,
                                       float* dw_local, float* scratch, dist::Communicator& tp) {
  GroupReducer red(tp);
  const ops::LossSum r =
      ops::lm_head_ce_vocab_parallel(h, w_local, nullptr, labels, T, D, V, shard.begin, shard.rows,
                                     chunk_rows, grad_scale, dh, dw_local, scratch, red);
  if (grad_scale != 0.0f && dh) tp.all_reduce(dh, T * D);
  return r;
}

}  // namespace titan::parallel
