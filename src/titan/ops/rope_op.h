// The RoPE op as modules call it, so that a plugin can supply its own kernel pair.
//   forward:  x[B·S, H, d] (token stride ldx) rotated in place by the angles of positions[B·S]
//             from the table cos_sin[max_pos, d] (cos | sin halves, rope_table()).
//   backward: the transpose of forward, in place on dx laid out like x. The table gets no
//             gradient.
// check(seq_len) runs once before training (e.g. a kernel that needs a sequence-length multiple)
// and throws titan::Error when the shape cannot be served.
// Ops are registered per (name, device, dtype); see plugin/registry.h.
// Header-only on purpose: plugins build against it without linking titan.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace titan::ops {

struct RopeOp {
  static constexpr const char* kKind = "RoPE";  // the op table's kind (plugin/registry.h)
  std::string name;
  std::string device = "cpu";
  std::string dtype = "float32";
  using Fn = std::function<void(float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                                const int32_t* positions, const float* cos_sin)>;
  Fn forward, backward;
  std::function<void(int64_t seq_len)> check;  // optional
};

// The table: cos_sin[p, i] = cos(p·θ^(−2i/d)) and cos_sin[p, d/2 + i] = sin(…) for i < d/2 and
// p < max_pos, as HF computes it in fp32 (inv_freq = 1/θ^(2i/d), angle = float(p)·inv_freq), the
// cos and sin in double then rounded. Host code: every backend's rope_table builds it here, so
// the tables agree to the bit (a device's powf or cos differs from glibc's by ulps, which long
// positions magnify into thousandths of the angle).
inline void rope_table_host(int64_t max_pos, int64_t d, double theta, float* cos_sin) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    const float inv = 1.0f / std::pow(static_cast<float>(theta), expo);
    for (int64_t p = 0; p < max_pos; ++p) {
      const float f = static_cast<float>(p) * inv;
      cos_sin[p * d + i] = static_cast<float>(std::cos(static_cast<double>(f)));
      cos_sin[p * d + half + i] = static_cast<float>(std::sin(static_cast<double>(f)));
    }
  }
}

}  // namespace titan::ops
