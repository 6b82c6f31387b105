#include "titan/train/check_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "titan/core/log.h"
#include "titan/models/qwen3/module_tree.h"
#include "titan/ops/elementwise.h"
#include "titan/plugin/registry.h"

namespace titan::train {
namespace {

struct Shape {
  int64_t B, S, H, d, ld;
  const char* what;
};

float to_bf16_value(float x) {  // round to nearest even bf16, back to fp32
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Diff {
  double abs = 0, rel = 0;
};

Diff compare(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    d.abs = std::max(d.abs, e);
    if (b[i] != 0) d.rel = std::max(d.rel, e / std::fabs(static_cast<double>(b[i])));
  }
  return d;
}

}  // namespace

bool check_kernels(const config::JobConfig& cfg, double tolerance) {
  const qwen3::Qwen3Args a = config::resolve_model(cfg);
  const int64_t S = cfg.training.seq_len;
  auto tree = qwen3::build_module_tree(a, S);
  const auto original = qwen3::rope_plan(*tree, a, S);
  std::vector<std::string> imports = plugin::split_list(cfg.override_.imports);
  for (const auto& lib : imports) plugin::Registry::global().load(lib);
  plugin::apply_overrides(tree, "model", imports);
  const auto replaced = qwen3::rope_plan(*tree, a, S);

  std::vector<float> table(static_cast<size_t>(S * a.head_dim));
  ops::rope_table(S, a.head_dim, a.rope_theta, table.data());
  bool ok = true;
  int checked = 0;
  std::vector<std::string> seen;
  for (size_t l = 0; l < replaced.size(); ++l) {
    const ops::RopeOp& ref = original[l];
    const ops::RopeOp& alt = replaced[l];
    if (alt.name == ref.name ||
        std::find(seen.begin(), seen.end(), ref.name + "->" + alt.name) != seen.end())
      continue;
    seen.push_back(ref.name + "->" + alt.name);
    const int64_t B = cfg.training.local_batch_size, d = a.head_dim;
    // The model's shapes (q and k heads, with the fused-QKV token stride) and edge shapes.
    const int64_t smallest = std::min<int64_t>(S, 128);
    const Shape shapes[] = {
        {B, S, a.n_heads, d, a.q_dim(), "q heads"},
        {B, S, a.n_kv_heads, d, a.kv_dim(), "k heads"},
        {1, smallest, 1, d, d, "one head"},
        {2, smallest, a.n_kv_heads, d, a.qkv_dim(), "strided"},
    };
    for (const Shape& sh : shapes) {
      for (bool bf16 : {false, true}) {
        std::mt19937 rng(1234);
        std::normal_distribution<float> nd;
        const size_t n = static_cast<size_t>(sh.B * sh.S * sh.ld);
        std::vector<float> x(n), dy(n);
        for (auto& v : x) v = bf16 ? to_bf16_value(nd(rng)) : nd(rng);
        for (auto& v : dy) v = bf16 ? to_bf16_value(nd(rng)) : nd(rng);
        std::vector<int32_t> pos(static_cast<size_t>(sh.B * sh.S));
        for (int64_t t = 0; t < sh.B * sh.S; ++t) pos[t] = static_cast<int32_t>((t % sh.S) % S);
        auto run = [&](const ops::RopeOp& op, std::vector<float> in, bool fwd) {
          (fwd ? op.forward : op.backward)(in.data(), sh.B, sh.S, sh.H, sh.d, sh.ld, pos.data(),
                                           table.data());
          return in;
        };
        const Diff fd = compare(run(alt, x, true), run(ref, x, true));
        const Diff bd = compare(run(alt, dy, false), run(ref, dy, false));
        char line[256];
        std::snprintf(line, sizeof line,
                      "check-kernel %s vs %s [%s B=%lld S=%lld H=%lld d=%lld, %s]: forward max abs "
                      "%.3g rel %.3g | backward max abs %.3g rel %.3g",
                      alt.name.c_str(), ref.name.c_str(), sh.what, static_cast<long long>(sh.B),
                      static_cast<long long>(sh.S), static_cast<long long>(sh.H),
                      static_cast<long long>(sh.d), bf16 ? "bf16 inputs" : "fp32", fd.abs, fd.rel,
                      bd.abs, bd.rel);
        log::info(line);
        ok &= fd.abs <= tolerance && bd.abs <= tolerance;
        ++checked;
      }
    }
  }
  if (checked == 0) {
    log::warn("check-kernel: no override replaced a kernel; pass --override.imports");
    return false;
  }
  log::info(ok ? "check-kernel: all outputs within tolerance" : "check-kernel: FAILED tolerance");
  return ok;
}

}  // namespace titan::train
