// Example plugin: a RoPE kernel with its own forward and backward that works in another memory
// layout, attached to every layer through an override — the way a Trainium (NKI) or CUDA kernel
// attaches to titan.
//
//   forward:  x[B·S, H, d] (token stride ldx) -> permute to [B, H, S, d] -> rotate each (j, j+d/2)
//             pair by the angle of its position (cos | sin table [max_pos, d]) -> permute back.
//   backward: differentiates forward: permute dx, rotate by the negative angle (the transpose of
//             a rotation), permute back; it reuses the saved cos/sin table and gives the table no
//             gradient.
//   check:    the kernel tiles the sequence in blocks of 128 (as the seed's kernel needs
//             128 × LNC), so training.seq_len must be a multiple of 128.
// It registers the op "layout_rope", the module config type LayoutRoPE.Config (a RoPE.Config
// with a seq_multiple field), and the override "layout_rope": an exact override of the built-in
// CosSinRoPE.Config on every layer.
//
// Build: a shared library compiled against titan's headers (see plugins/CMakeLists.txt).
// Use:   titan train --config qwen3_debugmodel --override.imports path/to/libtitan_layout_rope.so
#include <cstdint>
#include <string>
#include <vector>

#include "titan/plugin/plugin_api.h"

namespace {

constexpr int64_t kSeqMultiple = 128;

// Rotates rows of one [S, d] head slab in place; sign = +1 forward, -1 backward.
void rotate_slab(float* slab, int64_t S, int64_t d, const int32_t* positions, const float* cos_sin,
                 float sign) {
  const int64_t half = d / 2;
  for (int64_t s = 0; s < S; ++s) {
    float* row = slab + s * d;
    const float* c = cos_sin + static_cast<int64_t>(positions[s]) * d;
    const float* sn = c + half;
    for (int64_t j = 0; j < half; ++j) {
      const float x1 = row[j], x2 = row[j + half], sj = sign * sn[j];
      row[j] = x1 * c[j] - x2 * sj;
      row[j + half] = x2 * c[j] + x1 * sj;
    }
  }
}

void layout_rope(float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                 const int32_t* positions, const float* cos_sin, float sign) {
  thread_local std::vector<float> bhsd;  // [B, H, S, d]
  bhsd.resize(static_cast<size_t>(B * H * S * d));
  for (int64_t b = 0; b < B; ++b)  // permute in
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < d; ++j)
          bhsd[((b * H + h) * S + s) * d + j] = x[(b * S + s) * ldx + h * d + j];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      rotate_slab(bhsd.data() + (b * H + h) * S * d, S, d, positions + b * S, cos_sin, sign);
  for (int64_t b = 0; b < B; ++b)  // permute back
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < d; ++j)
          x[(b * S + s) * ldx + h * d + j] = bhsd[((b * H + h) * S + s) * d + j];
}

}  // namespace

extern "C" int titan_plugin_api_version(void) { return TITAN_PLUGIN_API_VERSION; }

extern "C" void titan_plugin_register(titan::plugin::Host* host) {
  titan::ops::RopeOp op;
  op.name = "layout_rope";
  op.forward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                  const int32_t* pos,
                  const float* cs) { layout_rope(x, B, S, H, d, ldx, pos, cs, 1.f); };
  op.backward = [](float* x, int64_t B, int64_t S, int64_t H, int64_t d, int64_t ldx,
                   const int32_t* pos,
                   const float* cs) { layout_rope(x, B, S, H, d, ldx, pos, cs, -1.f); };
  op.check = [](int64_t seq_len) {
    if (seq_len % kSeqMultiple != 0)
      throw titan::Error("layout_rope needs training.seq_len to be a multiple of " +
                         std::to_string(kSeqMultiple) + ", got " + std::to_string(seq_len) +
                         "; pick a multiple or drop the override");
  };
  host->add_op(op);

  host->add_module_type({"LayoutRoPE.Config",
                         {"RoPE.Config"},
                         {{"op", "layout_rope"},
                          {"theta", "1000000"},
                          {"max_seq_len", "0"},
                          {"seq_multiple", std::to_string(kSeqMultiple)}}});

  titan::plugin::Override ov;
  ov.name = "layout_rope";
  ov.target = "CosSinRoPE.Config";
  ov.exact = true;
  ov.description = "RoPE in [batch, heads, seq, head_dim] layout with its own backward";
  ov.factory = [host](const titan::config::ModuleNode& node) {
    // theta and max_seq_len carry over from the replaced node; op and seq_multiple are ours.
    return titan::config::derive(node, host->module_type("LayoutRoPE.Config"),
                                 {{"op", "layout_rope"}});
  };
  host->add_override(ov);
}
