// attention_cached (ops/attention.h): the new tokens' queries against their sequences' cached
// keys and values, for generation. Shapes: q[T, Hq, d] (token stride ldq); per token t the
// cache rows k[t][0:n_keys[t], Hkv·d], v[t][...] (row stride ldkv); o[T, Hq·d]. fp32 throughout.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "titan/ops/attention.h"
#include "titan/ops/simd.h"

namespace titan::ops {

void attention_cached(const float* q, int64_t ldq, const float* const* k, const float* const* v,
                      const int32_t* n_keys, int64_t ldkv, int64_t T, int64_t Hq, int64_t Hkv,
                      int64_t d, float scale, float* o) {
  const int64_t group = Hq / Hkv;
#pragma omp parallel
  {
    std::vector<float> p;  // this thread's scores of one (token, head)
#pragma omp for schedule(dynamic, 1)
    for (int64_t th = 0; th < T * Hq; ++th) {
      const int64_t t = th / Hq, h = th % Hq, g = h / group, n = n_keys[t];
      const float* qi = q + t * ldq + h * d;
      const float* kt = k[t] + g * d;
      const float* vt = v[t] + g * d;
      p.resize(static_cast<size_t>(n));
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = dot16(qi, kt + j * ldkv, d) * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.f;
      for (int64_t j = 0; j < n; ++j) sum += (p[j] = exp_fast(p[j] - mx));
      const float inv = 1.f / sum;
      float* oi = o + t * Hq * d + h * d;
      std::fill(oi, oi + d, 0.f);
      for (int64_t j = 0; j < n; ++j) {
        const float w = p[j] * inv;
        const float* vj = vt + j * ldkv;
        for (int64_t c = 0; c < d; ++c) oi[c] += w * vj[c];
      }
    }
  }
}

}  // namespace titan::ops
