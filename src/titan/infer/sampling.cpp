#include "titan/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "titan/core/rng.h"

namespace titan::infer {

void warp_logits(float* x, int64_t V, const Sampling& s) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (s.temperature != 1.0) {
    const auto t = static_cast<float>(s.temperature);
    for (int64_t i = 0; i < V; ++i) x[i] /= t;
  }
  if (s.top_k > 0 && s.top_k < V) {
    std::vector<float> v(x, x + V);
    std::nth_element(v.begin(), v.begin() + (s.top_k - 1), v.end(), std::greater<float>());
    const float kth = v[static_cast<size_t>(s.top_k - 1)];
    for (int64_t i = 0; i < V; ++i)
      if (x[i] < kth) x[i] = ninf;
  }
  if (s.top_p < 1.0) {
    // Ascending; which of equal logits comes first only decides which of equals crosses the
    // threshold (torch.sort leaves it unspecified): here the lower index first. (std::sort with
    // the index as tie-break, not std::stable_sort, whose temporary buffer GCC 12's libstdc++
    // frees with the wrong function under ASan.)
    std::vector<int64_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](int64_t a, int64_t b) { return x[a] < x[b] || (x[a] == x[b] && a < b); });
    const float mx = x[idx.back()];
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(x[i] - mx));
    double cum = 0;
    std::vector<int64_t> drop;
    for (size_t j = 0; j + 1 < idx.size(); ++j) {  // the last (most probable) is always kept
      cum += std::exp(static_cast<double>(x[idx[j]] - mx)) / z;
      if (cum <= 1.0 - s.top_p) drop.push_back(idx[j]);
    }
    for (int64_t i : drop) x[i] = ninf;
  }
}

int32_t next_token(float* x, int64_t V, const Sampling& s, uint64_t stream, uint64_t draw) {
  if (!s.greedy) warp_logits(x, V, s);
  const int64_t best = std::max_element(x, x + V) - x;  // the first of equal maxima
  if (s.greedy) return static_cast<int32_t>(best);
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(x[i] - x[best]));
  const double u = uniform_open(random_u64(s.seed, stream, draw)) * z;
  double cum = 0;
  int64_t last = best;
  for (int64_t i = 0; i < V; ++i) {
    const double p = std::exp(static_cast<double>(x[i] - x[best]));
    if (p == 0) continue;
    last = i;
    cum += p;
    if (u < cum) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // rounding at the very end
}

}  // namespace titan::infer
