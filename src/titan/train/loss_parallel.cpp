// Vocab-parallel lm_head + cross-entropy (loss_parallel.h states the maths).
#include "titan/train/loss_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "titan/core/error.h"
#include "titan/ops/gemm.h"

namespace titan::train {

VocabShard vocab_shard(int64_t V, int rank, int P) {
  const int64_t chunk = (V + P - 1) / P;
  const int64_t begin = std::min(V, chunk * rank);
  return {begin, std::min(V, begin + chunk) - begin};
}

int64_t lm_head_ce_vocab_parallel_scratch(int64_t T, int64_t V_local, int64_t chunk_rows) {
  const int64_t n = std::min(T, chunk_rows);
  return n * V_local + 3 * n;
}

ops::LossSum lm_head_ce_vocab_parallel(const float* h, const float* w_local, VocabShard shard,
                                       int64_t V, const int32_t* labels, int64_t T, int64_t D,
                                       int64_t chunk_rows, float grad_scale, float* dh,
                                       float* dw_local, float* scratch, dist::Communicator& tp) {
  for (int64_t t = 0; t < T; ++t)
    check(labels[t] == ops::kIgnoreIndex || (labels[t] >= 0 && labels[t] < V),
          "label " + std::to_string(labels[t]) + " at position " + std::to_string(t) +
              " is outside the vocabulary [0, " + std::to_string(V) + ") and is not -100");
  const bool grad = grad_scale != 0.0f && dh != nullptr;
  const int64_t Vr = shard.rows, v0 = shard.begin;
  const int64_t rows = std::min(T, chunk_rows);
  float* z = scratch;
  float* mx = z + rows * Vr;
  float* sum = mx + rows;
  ops::LossSum r;
  for (int64_t t0 = 0; t0 < T; t0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, T - t0);
    float* zt = sum + n;  // adjacent to sum: one all-reduce for both
    if (Vr > 0) ops::gemm(false, true, n, Vr, D, h + t0 * D, D, w_local, D, z, Vr, false);
    for (int64_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Vr; ++j) m = std::max(m, z[i * Vr + j]);
      mx[i] = m;
    }
    tp.all_reduce(mx, n, dist::ReduceOp::max);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t lab = labels[t0 + i];
      float s = 0.f;
      for (int64_t j = 0; j < Vr; ++j) s += std::exp(z[i * Vr + j] - mx[i]);
      sum[i] = s;
      zt[i] = lab >= v0 && lab < v0 + Vr ? z[i * Vr + (lab - v0)] : 0.f;
    }
    tp.all_reduce(sum, 2 * n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t lab = labels[t0 + i];
      float* zi = z + i * Vr;
      if (lab == ops::kIgnoreIndex) {
        if (grad) std::fill_n(zi, Vr, 0.f);
        continue;
      }
      const float lse = mx[i] + std::log(sum[i]);
      r.sum += static_cast<double>(lse - zt[i]);
      ++r.count;
      if (!grad) continue;
      for (int64_t j = 0; j < Vr; ++j) zi[j] = std::exp(zi[j] - lse) * grad_scale;
      if (lab >= v0 && lab < v0 + Vr) zi[lab - v0] -= grad_scale;
    }
    if (!grad) continue;
    float* dht = dh + t0 * D;
    if (Vr > 0)
      ops::gemm(false, false, n, D, Vr, z, Vr, w_local, D, dht, D, false);
    else
      std::fill_n(dht, n * D, 0.f);
    tp.all_reduce(dht, n * D);
    if (dw_local && Vr > 0)
      ops::gemm(true, false, Vr, D, n, z, Vr, h + t0 * D, D, dw_local, D, true);
  }
  return r;
}

}  // namespace titan::train
