#include "titan/tools/check_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/cpu.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/log.h"
#include "titan/models/qwen3/modules.h"
#include "titan/models/qwen3/spec.h"
#include "titan/models/registry.h"
#include "titan/ops/backend.h"
#include "titan/ops/device.h"
#include "titan/ops/elementwise.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/router.h"
#include "titan/plugin/registry.h"

namespace titan::tools {
namespace {

// Host arrays copied into the memory of the device whose kernel runs (host memory for the CPU)
// and back: a device's kernel reads and writes its own memory.
class Staging {
 public:
  explicit Staging(const std::string& device) : mem_(ops::backend(device, "float32").memory()) {}
  template <typename T>
  T* put(const std::vector<T>& v) {
    T* p = zeros<T>(v.size());
    copy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <typename T>
  T* zeros(size_t n) {
    keep_.emplace_back(std::max<size_t>(n, 1) * sizeof(T), mem_);
    return static_cast<T*>(keep_.back().data());
  }
  template <typename T>
  void get(std::vector<T>& v, const T* p) {
    copy(v.data(), p, v.size() * sizeof(T));
  }

 private:
  void copy(void* dst, const void* src, size_t bytes) {
    if (mem_.host())
      std::memcpy(dst, src, bytes);
    else
      mem_.copy(dst, src, bytes);
  }
  DeviceMemory mem_;
  std::vector<Storage> keep_;
};

struct Shape {
  int64_t B, S, H, d, ld;
  const char* what;
};

// Runs one pass of a kernel under check; whatever it throws (a std::exception or anything else)
// becomes one titan::Error naming the op and the pass, so a failing plugin kernel is never taken
// for a titan bug.
template <typename F>
void run_kernel(const char* kind, const std::string& name, const char* pass, F&& f) {
  const std::string head =
      std::string("check-kernel: the ") + kind + " op '" + name + "' failed in its " + pass + ": ";
  try {
    f();
  } catch (const std::exception& e) {
    throw Error(head + e.what());
  } catch (...) {
    throw Error(head + "it threw something that is not a std::exception");
  }
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

// Max |a − b| over max |b|: the experts' outputs are sums of D·F products whose order differs
// between kernels, so they are compared relative to the output's scale.
double scaled_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

// The tolerance for an fp32 experts kernel against the double-accumulated reference: the longest
// sum behind an output has n = max(D, 2·K·F) terms (dx sums K slots of two F-long products), and
// fp32 rounding grows like eps·√n for such sums; 8× that leaves room for unlucky inputs without
// hiding real errors (a wrong index or a missing term is O(1) of the scale).
double experts_tolerance(const ops::ExpertsShape& s) {
  const double n = static_cast<double>(std::max(s.D, 2 * s.K * s.F));
  return 8.0 * 1.1920929e-7 * std::sqrt(n);
}

// The tolerance for a bf16 experts kernel (bf16 GEMM operands, fp32 accumulation): every GEMM
// operand is rounded with relative error u = 2^-8, and an output passes through up to three
// rounded operands (x or dy, the hidden activation, a weight), so errors of a few u of the scale
// are expected (the built-in bf16 op measures about 1u); 5u = 2e-2 leaves room without hiding a
// wrong index or a missing term (O(1) of the scale).
constexpr double kBf16ExpertsTolerance = 2e-2;

// One experts op against the reference loop on shape s (routing from a random router, so
// experts get uneven loads; `one_expert` sends every token to expert 0 first). With bf16 the
// inputs are bf16-representable; a bf16 kernel (alt.dtype "bfloat16") also gets the bf16 weight
// copies and is held to kBf16ExpertsTolerance. Returns whether every output is within the
// tolerance of the reference's largest value.
bool check_experts(const ops::GroupedExpertsOp& alt, const ops::GroupedExpertsOp& ref,
                   const ops::ExpertsShape& s, bool bf16, bool one_expert, const char* what) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  auto fill = [&](std::vector<float>& v, float scale) {
    for (auto& x : v) x = bf16 ? round_to_bf16(scale * nd(rng)) : scale * nd(rng);
  };
  const size_t T = static_cast<size_t>(s.T), D = static_cast<size_t>(s.D),
               F = static_cast<size_t>(s.F), E = static_cast<size_t>(s.E),
               K = static_cast<size_t>(s.K);
  std::vector<float> x(T * D), dy(T * D), w1(E * F * D), w3(E * F * D), w2(E * D * F),
      logits(T * E), p(T * E), w(T * K);
  fill(x, 1.0f);
  fill(dy, 1.0f);
  fill(w1, 1.0f / std::sqrt(static_cast<float>(D)));
  fill(w3, 1.0f / std::sqrt(static_cast<float>(D)));
  fill(w2, 1.0f / std::sqrt(static_cast<float>(F)));
  fill(logits, 2.0f);
  if (one_expert)
    for (size_t t = 0; t < T; ++t) logits[t * E] = 100.0f;
  std::vector<uint16_t> w1b(w1.size()), w3b(w3.size()), w2b(w2.size());
  f32_to(DType::BF16, w1.data(), static_cast<int64_t>(w1.size()), w1b.data());
  f32_to(DType::BF16, w3.data(), static_cast<int64_t>(w3.size()), w3b.data());
  f32_to(DType::BF16, w2.data(), static_cast<int64_t>(w2.size()), w2b.data());
  std::vector<int32_t> idx(T * K);
  ops::router_fwd(logits.data(), nullptr, s.T, s.E, s.K, true, p.data(), idx.data(), w.data());
  struct Out {
    std::vector<float> y, dx, dw, dw1, dw3, dw2;
  };
  auto run = [&](const ops::GroupedExpertsOp& op) {
    Out o{std::vector<float>(T * D),     std::vector<float>(T * D),
          std::vector<float>(T * K),     std::vector<float>(E * F * D),
          std::vector<float>(E * F * D), std::vector<float>(E * D * F)};
    Staging dev(op.device);  // the op's inputs and outputs in its device's memory
    ops::ExpertsArgs a;
    a.s = s;
    a.x = dev.put(x);
    a.idx = dev.put(idx);
    a.w = dev.put(w);
    a.w1 = dev.put(w1);
    a.w3 = dev.put(w3);
    a.w2 = dev.put(w2);
    a.saved = dev.zeros<float>(static_cast<size_t>(op.saved_floats(s)));
    a.scratch = dev.zeros<float>(static_cast<size_t>(op.scratch_floats(s)));
    if (op.dtype == "bfloat16") {
      a.w1_bf16 = dev.put(w1b);
      a.w3_bf16 = dev.put(w3b);
      a.w2_bf16 = dev.put(w2b);
    }
    float* y = dev.zeros<float>(o.y.size());
    std::vector<float>* outs[] = {&o.dx, &o.dw, &o.dw1, &o.dw3, &o.dw2};
    float* g[5];
    for (int i = 0; i < 5; ++i) g[i] = dev.zeros<float>(outs[i]->size());
    run_kernel("grouped-experts", op.name, "forward", [&] { op.forward(a, y); });
    run_kernel("grouped-experts", op.name, "backward", [&] {
      op.backward(a, {dev.put(dy), g[0], g[1], g[2], g[3], g[4]});
    });
    dev.get(o.y, y);
    for (int i = 0; i < 5; ++i) dev.get(*outs[i], g[i]);
    return o;
  };
  const Out a = run(alt), b = run(ref);
  const double tol = alt.dtype == "bfloat16" ? kBf16ExpertsTolerance : experts_tolerance(s);
  const std::string where = ops::device(alt.device).host ? "" : " on " + alt.device;
  const double e[6] = {scaled_diff(a.y, b.y),     scaled_diff(a.dx, b.dx),
                       scaled_diff(a.dw, b.dw),   scaled_diff(a.dw1, b.dw1),
                       scaled_diff(a.dw3, b.dw3), scaled_diff(a.dw2, b.dw2)};
  char line[400];
  std::snprintf(
      line, sizeof line,
      "check-kernel %s%s vs %s [%s T=%lld D=%lld F=%lld E=%lld K=%lld, %s]: max |Δ|/max|ref| "
      "y %.3g | dx %.3g dw %.3g dw1 %.3g dw3 %.3g dw2 %.3g (tolerance %.2g)",
      alt.name.c_str(), where.c_str(), ref.name.c_str(), what, static_cast<long long>(s.T),
      static_cast<long long>(s.D), static_cast<long long>(s.F), static_cast<long long>(s.E),
      static_cast<long long>(s.K),
      alt.dtype == "bfloat16" ? "bf16 kernel" : (bf16 ? "fp32 kernel, bf16 inputs" : "fp32"), e[0],
      e[1], e[2], e[3], e[4], e[5], tol);
  log::info(line);
  bool ok = true;
  for (double v : e) ok &= v <= tol;
  return ok;
}

}  // namespace

// Long by its two blocks, one per op kind (RoPE, then grouped experts with its edge shapes and
// memory check), each comparing every replaced kernel with the code it replaces on the model's
// shapes; they share the module trees, the device and the count of what was checked.
bool check_kernels(const config::JobConfig& cfg, double tolerance) {
  // The module tree before and after the overrides, as build_model makes them; the shapes
  // checked are Qwen3's (RoPE on q/k heads, grouped experts).
  models::validate_model_config(cfg);
  const qwen3::Qwen3Args a = qwen3::args_from_config(cfg);
  const int64_t S = cfg.training.seq_len;
  // --training.device: the kernels of that device (its built-in ones too) against the CPU's.
  const std::string& device = cfg.training.device;
  if (const ops::Device& dev = ops::device(device); dev.usable) {
    std::string why;
    const bool usable = dev.usable(&why);
    check(usable, "check-kernel --training.device " + device + ": " + why);
  }
  const plugin::Registry& reg = plugin::Registry::global();
  const auto original =
      qwen3::rope_plan(*models::model_spec(cfg.model.name).module_tree(cfg, S), a, S);
  auto tree = models::overridden_module_tree(cfg, S);
  const auto replaced = qwen3::rope_plan(*tree, a, S, reg, device);

  std::vector<float> table(static_cast<size_t>(S * a.head_dim));
  ops::rope_table(S, a.head_dim, a.rope_theta, table.data());
  bool ok = true;
  int checked = 0;
  std::vector<std::string> seen;
  for (size_t l = 0; l < replaced.size(); ++l) {
    const ops::RopeOp& ref = original[l];
    const ops::RopeOp& alt = replaced[l];
    if ((alt.name == ref.name && alt.device == ref.device) ||
        std::find(seen.begin(), seen.end(), ref.name + "->" + alt.name) != seen.end())
      continue;
    seen.push_back(ref.name + "->" + alt.name);
    const std::string where = ops::device(alt.device).host ? "" : " on " + alt.device;
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
        for (auto& v : x) v = bf16 ? round_to_bf16(nd(rng)) : nd(rng);
        for (auto& v : dy) v = bf16 ? round_to_bf16(nd(rng)) : nd(rng);
        std::vector<int32_t> pos(static_cast<size_t>(sh.B * sh.S));
        for (int64_t t = 0; t < sh.B * sh.S; ++t) pos[t] = static_cast<int32_t>((t % sh.S) % S);
        auto run = [&](const ops::RopeOp& op, std::vector<float> in, bool fwd) {
          Staging dev(op.device);
          float* x_dev = dev.put(in);
          run_kernel("RoPE", op.name, fwd ? "forward" : "backward", [&] {
            (fwd ? op.forward : op.backward)(x_dev, sh.B, sh.S, sh.H, sh.d, sh.ld, dev.put(pos),
                                             dev.put(table));
          });
          dev.get(in, x_dev);
          return in;
        };
        const Diff fd = compare(run(alt, x, true), run(ref, x, true));
        const Diff bd = compare(run(alt, dy, false), run(ref, dy, false));
        char line[256];
        std::snprintf(line, sizeof line,
                      "check-kernel %s%s vs %s [%s B=%lld S=%lld H=%lld d=%lld, %s]: forward max "
                      "abs %.3g rel %.3g | backward max abs %.3g rel %.3g",
                      alt.name.c_str(), where.c_str(), ref.name.c_str(), sh.what,
                      static_cast<long long>(sh.B), static_cast<long long>(sh.S),
                      static_cast<long long>(sh.H), static_cast<long long>(sh.d),
                      bf16 ? "bf16 inputs" : "fp32", fd.abs, fd.rel, bd.abs, bd.rel);
        log::info(line);
        ok &= fd.abs <= tolerance && bd.abs <= tolerance;
        ++checked;
      }
    }
  }
  // Grouped experts: every distinct op the (overridden) model uses against the reference loop,
  // on the model's layer shape (at most 1024 tokens, to keep the reference loop quick) and edge
  // shapes: one token, more experts than tokens (empty experts), all tokens to one expert.
  if (a.is_moe()) {
    // Each case holds the three expert weights and, for both ops, their three gradients:
    // 9 · E·F·D floats. Refuse before allocating what cannot fit.
    int64_t efd = 0, bytes = 0;
    const bool fits = !__builtin_mul_overflow(a.num_experts, a.moe_hidden_dim, &efd) &&
                      !__builtin_mul_overflow(efd, a.dim, &efd) &&
                      !__builtin_mul_overflow(efd, int64_t{36}, &bytes);
    const int64_t mem = cpu::total_memory_bytes();
    if (mem > 0 && (!fits || bytes > mem)) {
      char buf[256];
      std::snprintf(
          buf, sizeof buf,
          "check-kernel needs %.4g GiB for one MoE layer's expert weights and "
          "gradients (9 × num_experts %lld × moe_hidden_dim %lld × dim %lld floats); "
          "this machine has %.1f GiB; reduce model.num_experts or model.moe_hidden_dim",
          36.0 * static_cast<double>(a.num_experts) * static_cast<double>(a.moe_hidden_dim) *
              static_cast<double>(a.dim) / (1024.0 * 1024.0 * 1024.0),
          static_cast<long long>(a.num_experts), static_cast<long long>(a.moe_hidden_dim),
          static_cast<long long>(a.dim), static_cast<double>(mem) / (1024.0 * 1024.0 * 1024.0));
      throw Error(buf);
    }
    const auto experts = qwen3::experts_plan(*tree, a, cfg.training.local_batch_size * S,
                                             DType::F32, false, reg, device);
    const ops::GroupedExpertsOp ref =
        plugin::Registry::global().op<ops::GroupedExpertsOp>("grouped_experts_reference");
    std::vector<std::string> done;
    for (const auto& op : experts) {
      if (!op.forward || std::find(done.begin(), done.end(), op.name) != done.end()) continue;
      done.push_back(op.name);
      const int64_t T = std::min<int64_t>(cfg.training.local_batch_size * S, 1024);
      const int64_t D = a.dim, F = a.moe_hidden_dim, E = a.num_experts, K = a.top_k;
      const struct {
        ops::ExpertsShape s;
        bool one;
        const char* what;
      } cases[] = {{{T, D, F, E, K}, false, "layer"},
                   {{1, D, F, E, K}, false, "one token"},
                   {{std::max<int64_t>(1, E / 4), D, F, E, K}, false, "empty experts"},
                   {{std::min<int64_t>(T, 64), D, F, E, K}, true, "one hot expert"}};
      // The bf16 row runs the op's bfloat16 kernel when it has one, else its fp32 kernel on
      // bf16-representable inputs.
      const bool has_bf16 =
          reg.ops().has(ops::GroupedExpertsOp::kKind, op.name, device, "bfloat16");
      for (const auto& c : cases)
        for (bool bf16 : {false, true}) {
          const ops::GroupedExpertsOp& k =
              bf16 && has_bf16 ? reg.op<ops::GroupedExpertsOp>(op.name, device, "bfloat16") : op;
          ok &= check_experts(k, ref, c.s, bf16, c.one, c.what);
          ++checked;
        }
    }
  }
  if (checked == 0) {
    if (cfg.override_.imports.empty()) {
      log::warn("check-kernel: no override replaced a kernel; pass --override.imports");
    } else {
      log::warn("check-kernel: --override.imports '" + cfg.override_.imports +
                "' replaced no RoPE or grouped-experts kernel of this model, so there is nothing "
                "to compare (the lines above show what was replaced); check that its overrides "
                "target this model's nodes");
    }
    return false;
  }
  log::info(ok ? "check-kernel: all outputs within tolerance" : "check-kernel: FAILED tolerance");
  return ok;
}

}  // namespace titan::tools
