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

}  // namespace titan::ops
