// Tiled attention (forward and backward) against a naive double-precision reference of
//   o_i = Σ_j softmax_j(scale·q_i·k_j) v_j over the visible keys seg_start[i] <= j <= i,
//   lse_i = log Σ_j exp(scale·q_i·k_j),
// with query head h reading kv head h / (Hq/Hkv) (HF repeat_kv).
//
// The backward is checked for L = Σ r ⊙ o (dout = r) in two ways:
//  * every element of dq, dk, dv against the analytic gradient of the double reference, and
//  * sampled elements (tile edges, document boundaries, random ones) against central finite
//    differences of the double reference (eps = 1e-5), which also validates the analytic one.
// Tolerance: 1e-4 relative plus 1e-4 of the tensor's largest magnitude (fp32 tiles with an
// online softmax over ≤ 130 keys are ~1e-6 off; exp_fast is ~2 ulp).
//
// Shapes cover GQA ratios 1, 2, 3, 4, head_dim 16, 20, 32, 40, 128, S = 5, 67, 130 (not multiples
// of the 64-wide tiles), B = 2, plain causal and block-causal masks, and q/k/v read with token
// strides wider than the heads: either one fused [T, (Hq+2Hkv)·d] buffer as the model uses, or
// three separate buffers with different padded strides (so ldq, ldk and ldv all differ).
#include "titan/ops/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "reference_util.h"

namespace titan::ops {
namespace {

using kernel_test::expect_close;
using kernel_test::uniform;

constexpr double kRtol = 1e-4, kAtol = 1e-4;

// seg_start from positions, written independently of the kernel: the index of the last
// position-0 token at or before i within the row (0 if none, or if !block_causal).
std::vector<int32_t> ref_segments(const std::vector<int32_t>& pos, int64_t B, int64_t S,
                                  bool block_causal) {
  std::vector<int32_t> seg(B * S, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      int32_t st = 0;
      if (block_causal)
        for (int64_t j = i; j > 0; --j)
          if (pos[b * S + j] == 0) {
            st = static_cast<int32_t>(j);
            break;
          }
      seg[b * S + i] = st;
    }
  return seg;
}

// Positions of one row from the indices where documents start; the row may begin mid-document
// (first_pos > 0), as packed rows do.
std::vector<int32_t> row_positions(int64_t S, const std::vector<int64_t>& starts,
                                   int32_t first_pos) {
  std::vector<int32_t> p(S);
  int32_t cur = first_pos;
  for (int64_t i = 0; i < S; ++i) {
    if (std::find(starts.begin(), starts.end(), i) != starts.end()) cur = 0;
    p[i] = cur++;
  }
  return p;
}

TEST(AttentionSegmentsTest, CausalAndBlockCausal) {
  const int64_t B = 2, S = 10;
  auto r0 = row_positions(S, {0, 3, 4, 9}, 0);
  auto r1 = row_positions(S, {5}, 7);  // starts mid-document
  std::vector<int32_t> pos = r0;
  pos.insert(pos.end(), r1.begin(), r1.end());
  std::vector<int32_t> seg(B * S, -1);
  attention_segments(pos.data(), B, S, true, seg.data());
  std::vector<int32_t> want = {0, 0, 0, 3, 4, 4, 4, 4, 4, 9, 0, 0, 0, 0, 0, 5, 5, 5, 5, 5};
  EXPECT_EQ(seg, want);
  EXPECT_EQ(seg, ref_segments(pos, B, S, true));
  attention_segments(pos.data(), B, S, false, seg.data());
  EXPECT_EQ(seg, std::vector<int32_t>(B * S, 0));
}

struct AttnCase {
  int64_t B, S, Hq, Hkv, d;
  bool block_causal;
  bool fused;                                // one [T, (Hq+2Hkv)·d] buffer, else three
  std::vector<std::vector<int64_t>> starts;  // per row: document starts (block-causal)
  std::vector<int32_t> first_pos;            // per row: position of token 0
};

// Test data: q, k, v inside one float buffer `x` at offsets qo/ko/vo with token strides
// ldq/ldk/ldv, and the double copy `xd` the reference reads (and finite differences perturb).
struct Problem {
  AttnCase c;
  AttnShape s{};
  int64_t qo = 0, ko = 0, vo = 0, size = 0;
  std::vector<float> x;
  std::vector<double> xd;
  std::vector<int32_t> pos, seg;
  std::vector<float> r;  // dout, [T, Hq·d]

  int64_t qi(int64_t t, int64_t h, int64_t c) const { return qo + t * s.ldq + h * s.d + c; }
  int64_t ki(int64_t t, int64_t g, int64_t c) const { return ko + t * s.ldk + g * s.d + c; }
  int64_t vi(int64_t t, int64_t g, int64_t c) const { return vo + t * s.ldv + g * s.d + c; }
};

Problem make_problem(const AttnCase& c, uint32_t seed) {
  Problem p;
  p.c = c;
  const int64_t T = c.B * c.S, d = c.d;
  p.s.B = c.B, p.s.S = c.S, p.s.Hq = c.Hq, p.s.Hkv = c.Hkv, p.s.d = d;
  p.s.scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (c.fused) {
    const int64_t ld = (c.Hq + 2 * c.Hkv) * d;
    p.s.ldq = p.s.ldk = p.s.ldv = ld;
    p.qo = 0, p.ko = c.Hq * d, p.vo = (c.Hq + c.Hkv) * d;
    p.size = T * ld;
  } else {
    p.s.ldq = c.Hq * d + 3, p.s.ldk = c.Hkv * d + 5, p.s.ldv = c.Hkv * d + 9;
    p.qo = 0, p.ko = T * p.s.ldq, p.vo = p.ko + T * p.s.ldk;
    p.size = p.vo + T * p.s.ldv;
  }
  std::mt19937 g(seed);
  // Padding holds NaN: reading it would poison the outputs. Values in [-2, 2] give scores with a
  // standard deviation of ~1.3 after the d^-0.5 scale, so the softmax is far from uniform.
  p.x.assign(p.size, std::numeric_limits<float>::quiet_NaN());
  auto vals = uniform(p.size, g, -2.f, 2.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t col = 0; col < d; ++col) {
      for (int64_t h = 0; h < c.Hq; ++h) p.x[p.qi(t, h, col)] = vals[p.qi(t, h, col)];
      for (int64_t h = 0; h < c.Hkv; ++h) {
        p.x[p.ki(t, h, col)] = vals[p.ki(t, h, col)];
        p.x[p.vi(t, h, col)] = vals[p.vi(t, h, col)];
      }
    }
  p.xd.assign(p.x.begin(), p.x.end());
  for (int64_t b = 0; b < c.B; ++b) {
    auto row = c.block_causal ? row_positions(c.S, c.starts[b], c.first_pos[b])
                              : row_positions(c.S, {}, 0);
    p.pos.insert(p.pos.end(), row.begin(), row.end());
  }
  p.seg = ref_segments(p.pos, c.B, c.S, c.block_causal);
  p.r = uniform(T * c.Hq * d, g, -1.f, 1.f);
  return p;
}

// Reference output of query (b, h, i): writes o[d], returns lse. Reads p.xd.
double ref_row(const Problem& p, int64_t b, int64_t h, int64_t i, double* o,
               std::vector<double>& prob) {
  const AttnShape& s = p.s;
  const int64_t g = h / (s.Hq / s.Hkv), lo = p.seg[b * s.S + i], t = b * s.S + i;
  double mx = -std::numeric_limits<double>::infinity();
  prob.resize(s.S);
  for (int64_t j = lo; j <= i; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < s.d; ++c) dot += p.xd[p.qi(t, h, c)] * p.xd[p.ki(b * s.S + j, g, c)];
    prob[j] = static_cast<double>(s.scale) * dot;
    mx = std::max(mx, prob[j]);
  }
  double sum = 0;
  for (int64_t j = lo; j <= i; ++j) sum += (prob[j] = std::exp(prob[j] - mx));
  std::fill_n(o, s.d, 0.0);
  for (int64_t j = lo; j <= i; ++j) {
    prob[j] /= sum;
    for (int64_t c = 0; c < s.d; ++c) o[c] += prob[j] * p.xd[p.vi(b * s.S + j, g, c)];
  }
  return mx + std::log(sum);
}

// Analytic gradients of L = Σ r ⊙ o in double: dS = P ⊙ (dP − rowsum(P ⊙ dP)), dP = r·vᵀ.
// dq [T, Hq·d]; dk, dv in the layout of x (at ko / vo).
void ref_backward(const Problem& p, std::vector<double>& dq, std::vector<double>& dkv) {
  const AttnShape& s = p.s;
  const int64_t T = s.B * s.S, d = s.d, ldo = s.Hq * d;
  dq.assign(T * ldo, 0.0);
  dkv.assign(p.size, 0.0);
  std::vector<double> o(d), prob, dp(s.S);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.S; ++i) {
        const int64_t t = b * s.S + i, g = h / (s.Hq / s.Hkv), lo = p.seg[t];
        ref_row(p, b, h, i, o.data(), prob);
        const float* ri = p.r.data() + t * ldo + h * d;
        double delta = 0;
        for (int64_t j = lo; j <= i; ++j) {
          dp[j] = 0;
          for (int64_t c = 0; c < d; ++c) dp[j] += ri[c] * p.xd[p.vi(b * s.S + j, g, c)];
          delta += prob[j] * dp[j];
        }
        for (int64_t j = lo; j <= i; ++j) {
          const double ds = prob[j] * (dp[j] - delta) * static_cast<double>(s.scale);
          const int64_t tj = b * s.S + j;
          for (int64_t c = 0; c < d; ++c) {
            dq[t * ldo + h * d + c] += ds * p.xd[p.ki(tj, g, c)];
            dkv[p.ki(tj, g, c)] += ds * p.xd[p.qi(t, h, c)];
            dkv[p.vi(tj, g, c)] += prob[j] * ri[c];
          }
        }
      }
}

// Finite difference of L at element x[idx] of a q (kind 0), k (1) or v (2) head: only the
// outputs that element reaches are recomputed (one query for q; for k/v, the group's query
// heads at queries i >= j whose document contains key j); the others cancel exactly.
double fd_at(Problem& p, int kind, int64_t t, int64_t head, int64_t idx) {
  const AttnShape& s = p.s;
  const int64_t b = t / s.S, j = t % s.S, group = s.Hq / s.Hkv, ldo = s.Hq * s.d;
  std::vector<double> o(s.d), prob;
  auto partial_L = [&] {
    double L = 0;
    auto add_row = [&](int64_t h, int64_t i) {
      ref_row(p, b, h, i, o.data(), prob);
      const float* ri = p.r.data() + (b * s.S + i) * ldo + h * s.d;
      for (int64_t c = 0; c < s.d; ++c) L += ri[c] * o[c];
    };
    if (kind == 0) {
      add_row(head, j);
    } else {
      for (int64_t h = head * group; h < (head + 1) * group; ++h)
        for (int64_t i = j; i < s.S; ++i)
          if (p.seg[b * s.S + i] <= j) add_row(h, i);
    }
    return L;
  };
  const double eps = 1e-5, x0 = p.xd[idx];
  p.xd[idx] = x0 + eps;
  const double lp = partial_L();
  p.xd[idx] = x0 - eps;
  const double lm = partial_L();
  p.xd[idx] = x0;
  return (lp - lm) / (2 * eps);
}

// bf16 = true runs attention_fwd_bf16 / attention_bwd_bf16 (bf16 GEMM inputs, fp32 softmax and
// accumulation) against the same double reference at the bf16 level: each product's operands are
// rounded with relative error at most u = 2^-8, which moves scores (|q·k|·scale ~ a few here) by a
// few u and probabilities by as much; tolerance 2e-2 of each tensor's scale (measured errors are
// recorded as test properties). No finite differences: the reference's own gradients are checked
// against them in the fp32 case.
void run_case(const AttnCase& c, uint32_t seed, bool bf16 = false) {
  Problem p = make_problem(c, seed);
  const AttnShape& s = p.s;
  const int64_t T = s.B * s.S, d = s.d, ldo = s.Hq * d;

  // attention_segments agrees with the reference segments.
  std::vector<int32_t> seg(T, -1);
  attention_segments(p.pos.data(), s.B, s.S, c.block_causal, seg.data());
  ASSERT_EQ(seg, p.seg);

  const float* q = p.x.data() + p.qo;
  const float* k = p.x.data() + p.ko;
  const float* v = p.x.data() + p.vo;
  const auto fwd = bf16 ? attention_fwd_bf16 : attention_fwd;
  const auto bwd = bf16 ? attention_bwd_bf16 : attention_bwd;
  const double rtol = bf16 ? 0 : kRtol, atol = bf16 ? 2e-2 : kAtol;
  std::vector<float> scratch(bf16 ? attention_bf16_workspace(s) : attention_workspace(s));
  std::vector<float> o(T * ldo, 12345.f), lse(s.B * s.Hq * s.S, 12345.f);
  fwd(s, q, k, v, seg.data(), o.data(), lse.data(), scratch.data());

  // Forward vs reference.
  std::vector<double> oref(T * ldo), lref(s.B * s.Hq * s.S), prob;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.S; ++i)
        lref[(b * s.Hq + h) * s.S + i] =
            ref_row(p, b, h, i, oref.data() + (b * s.S + i) * ldo + h * d, prob);
  expect_close("o", o, oref, rtol, atol);
  expect_close("lse", lse, lref, rtol, atol);

  // Backward with dout = r; dk/dv written into a buffer laid out like x (sentinel elsewhere).
  const float sentinel = 777.f;
  std::vector<float> dq(T * ldo, sentinel), dx(p.size, sentinel), delta(s.B * s.Hq * s.S);
  bwd(s, q, k, v, o.data(), lse.data(), p.r.data(), seg.data(), dq.data(), dx.data() + p.ko,
      dx.data() + p.vo, delta.data(), scratch.data());

  std::vector<double> dq_ref, dkv_ref;
  ref_backward(p, dq_ref, dkv_ref);
  std::vector<int64_t> k_idx, v_idx;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < s.Hkv; ++g)
      for (int64_t col = 0; col < d; ++col) {
        k_idx.push_back(p.ki(t, g, col));
        v_idx.push_back(p.vi(t, g, col));
      }
  expect_close("dq (analytic ref)", dq, dq_ref, rtol, atol);
  expect_close("dk (analytic ref)", dx.data(), dkv_ref.data(), k_idx, rtol, atol);
  expect_close("dv (analytic ref)", dx.data(), dkv_ref.data(), v_idx, rtol, atol);
  // Nothing outside dk/dv is written: q's part of the buffer and the padding keep the sentinel.
  std::vector<char> is_kv(p.size, 0);
  for (int64_t i : k_idx) is_kv[i] = 1;
  for (int64_t i : v_idx) is_kv[i] = 1;
  for (int64_t i = 0; i < p.size; ++i)
    if (!is_kv[i]) {
      ASSERT_EQ(dx[i], sentinel) << "attention_bwd wrote outside dk/dv at " << i;
    }
  if (bf16) return;

  // Finite differences at sampled elements: tokens at tile edges and document boundaries in both
  // rows, plus random ones; random head and column.
  std::mt19937 g(seed + 1000);
  std::vector<int64_t> tokens;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t j : {int64_t{0}, int64_t{1}, int64_t{62}, int64_t{63}, int64_t{64}, int64_t{65},
                      int64_t{127}, int64_t{128}, s.S - 1})
      if (j < s.S) tokens.push_back(b * s.S + j);
    if (c.block_causal)
      for (int64_t st : c.starts[b])
        for (int64_t j : {st - 1, st})
          if (j >= 0 && j < s.S) tokens.push_back(b * s.S + j);
  }
  for (int n = 0; n < 6; ++n) tokens.push_back(static_cast<int64_t>(g() % T));
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());

  std::vector<int64_t> sq, sk, sv;
  std::vector<double> fq, fk, fv;
  for (int64_t t : tokens) {
    const int64_t hq = g() % s.Hq, hk = g() % s.Hkv, c1 = g() % d, c2 = g() % d, c3 = g() % d;
    sq.push_back(t * ldo + hq * d + c1);
    fq.push_back(fd_at(p, 0, t, hq, p.qi(t, hq, c1)));
    sk.push_back(p.ki(t, hk, c2));
    fk.push_back(fd_at(p, 1, t, hk, p.ki(t, hk, c2)));
    sv.push_back(p.vi(t, hk, c3));
    fv.push_back(fd_at(p, 2, t, hk, p.vi(t, hk, c3)));
  }
  // Absolute tolerances scaled by the full gradient tensors' magnitudes (from the analytic
  // reference), relative 1e-4; the analytic reference itself must agree to 1e-7.
  auto check_fd = [&](const char* what, const std::vector<int64_t>& idx,
                      const std::vector<double>& fd, const float* got, const double* ref,
                      const std::vector<int64_t>& all) {
    double scale = 0;
    for (int64_t i : all) scale = std::max(scale, std::abs(ref[i]));
    double max_k = 0, max_r = 0;
    for (size_t n = 0; n < idx.size(); ++n) {
      const double ek = std::abs(got[idx[n]] - fd[n]), er = std::abs(ref[idx[n]] - fd[n]);
      EXPECT_LE(ek, kRtol * std::abs(fd[n]) + kAtol * scale)
          << what << " kernel vs finite difference at buffer index " << idx[n] << ": got "
          << got[idx[n]] << " fd " << fd[n];
      EXPECT_LE(er, 1e-7 * (std::abs(fd[n]) + scale))
          << what << " analytic reference vs finite difference at " << idx[n];
      max_k = std::max(max_k, ek / scale);
      max_r = std::max(max_r, er / scale);
    }
    ::testing::Test::RecordProperty(std::string("fd maxerr ") + what,
                                    kernel_test::sci(max_k) + " (ref " + kernel_test::sci(max_r) +
                                        ") of max|grad| " + kernel_test::sci(scale));
  };
  check_fd("dq", sq, fq, dq.data(), dq_ref.data(), kernel_test::iota_idx(T * ldo));
  check_fd("dk", sk, fk, dx.data(), dkv_ref.data(), k_idx);
  check_fd("dv", sv, fv, dx.data(), dkv_ref.data(), v_idx);
}

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, ForwardAndBackwardMatchReference) {
  run_case(GetParam(), 100 + static_cast<uint32_t>(GetParam().S + GetParam().d));
}

TEST_P(AttentionTest, Bf16MatchesReferenceToBf16Rounding) {
  run_case(GetParam(), 100 + static_cast<uint32_t>(GetParam().S + GetParam().d), true);
}

AttnCase causal(int64_t S, int64_t Hq, int64_t Hkv, int64_t d, bool fused) {
  return {2, S, Hq, Hkv, d, false, fused, {}, {}};
}

AttnCase block(int64_t S, int64_t Hq, int64_t Hkv, int64_t d, bool fused,
               std::vector<int64_t> starts0, std::vector<int64_t> starts1, int32_t first_pos1) {
  return {2, S, Hq, Hkv, d, true, fused, {std::move(starts0), std::move(starts1)}, {0, first_pos1}};
}

std::string name(const AttnCase& c) {
  return std::string(c.block_causal ? "Block" : "Causal") + "_S" + std::to_string(c.S) + "_Hq" +
         std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_d" + std::to_string(c.d) +
         (c.fused ? "_Fused" : "_Strided");
}
void PrintTo(const AttnCase& c, std::ostream* os) { *os << name(c); }
std::string case_name(const ::testing::TestParamInfo<AttnCase>& info) { return name(info.param); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        // Plain causal (attention_segments with block_causal = false).
        causal(5, 2, 2, 16, true), causal(67, 4, 2, 32, true), causal(67, 4, 1, 128, false),
        causal(130, 2, 1, 32, false),
        // Block-causal. Row 0: documents start at 37 (inside tile 0), 64 (tile edge: query tile
        // 1 sees no key of tile 0), 100 and 128 (tile edge, a 2-token document). Row 1 starts
        // mid-document (position 7) with starts at 63 (last key of tile 0), 65 and 129 (a
        // 1-token last document).
        block(130, 4, 1, 16, true, {0, 37, 64, 100, 128}, {63, 65, 129}, 7),
        // Single-token documents at the start, a document spanning the tile edge at 64, and one
        // starting on the second tile edge.
        block(130, 4, 2, 32, false, {0, 1, 2, 70, 127, 128}, {0, 64}, 0),
        // head_dim 128; row 1 is a single document starting mid-document (same as causal).
        block(130, 2, 2, 128, true, {0, 50, 64, 129}, {}, 3),
        block(67, 4, 2, 16, true, {0, 20, 64, 66}, {5, 6}, 2),
        block(5, 4, 1, 32, false, {0, 2, 3}, {4}, 1),
        // head_dim not a multiple of the micro-kernel's 32/8-wide column blocks (the scalar
        // column tail), and a GQA ratio of 3.
        block(67, 2, 1, 20, false, {0, 31, 64}, {10}, 4), causal(67, 6, 2, 40, true),
        // Past the bf16 kernel's 128-query blocks: three blocks, a document across the edge at
        // 128 and one starting at 256.
        block(300, 2, 1, 32, false, {0, 100, 256}, {0, 129}, 3)),
    case_name);

// Context parallelism's calls (AttnShape q0, Sk, accumulate): the queries [q0, q0 + n) of a row
// against its keys [0, q0 + n) give the rows of the whole row's call: o and lse (fp32: the same
// key tiles in the same order, so equal to ~1e-7), and dq, and dk, dv of the whole row's
// backward with dout zero outside the chunk, added onto what dk, dv held. Tolerance: fp32 1e-5
// relative plus 1e-6 of the scale (the query tiles start at q0, so dk and dv add their terms in
// other groups); bf16 2e-3 of the scale (the key blocks start elsewhere, so the bf16 GEMMs sum
// in other orders).
void chunk_case(bool bf16) {
  const int64_t S = 200, Hq = 4, Hkv = 2, d = 16, KV = Hkv * d, ldo = Hq * d;
  const AttnCase c{1, S, Hq, Hkv, d, true, false, {{0, 37, 64, 130, 190}}, {5}};
  Problem p = make_problem(c, 7);
  const AttnShape& s = p.s;
  const float* q = p.x.data() + p.qo;
  const float* k = p.x.data() + p.ko;
  const float* v = p.x.data() + p.vo;
  const auto fwd = bf16 ? attention_fwd_bf16 : attention_fwd;
  const auto bwd = bf16 ? attention_bwd_bf16 : attention_bwd;
  const auto work = bf16 ? attention_bf16_workspace : attention_workspace;
  const double rtol = bf16 ? 0 : 1e-5, atol = bf16 ? 2e-3 : 1e-6;
  std::vector<float> ws(work(s));
  std::vector<float> o(S * ldo), lse(Hq * S), delta(Hq * S);
  fwd(s, q, k, v, p.seg.data(), o.data(), lse.data(), ws.data());
  for (const auto& [q0, n] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 50}, {50, 50}, {64, 33}, {100, 100}, {150, 50}}) {
    const std::string what = "queries [" + std::to_string(q0) + ", " + std::to_string(q0 + n) +
                             ")" + (bf16 ? " bf16" : "");
    AttnShape cs = s;
    cs.S = n;
    cs.Sk = q0 + n;
    cs.q0 = q0;
    std::vector<float> cws(std::max(work(cs), work(s)));
    std::vector<float> co(n * ldo), clse(Hq * n);
    fwd(cs, q + q0 * s.ldq, k, v, p.seg.data() + q0, co.data(), clse.data(), cws.data());
    std::vector<double> want_o(o.begin() + q0 * ldo, o.begin() + (q0 + n) * ldo), want_lse;
    for (int64_t h = 0; h < Hq; ++h)
      want_lse.insert(want_lse.end(), lse.begin() + h * S + q0, lse.begin() + h * S + q0 + n);
    expect_close(what + " o", co, want_o, rtol, atol);
    expect_close(what + " lse", clse, want_lse, rtol, atol);

    // The whole row's backward with dout on the chunk's rows only.
    std::vector<float> dout(S * ldo, 0.f);
    std::copy(p.r.begin() + q0 * ldo, p.r.begin() + (q0 + n) * ldo, dout.begin() + q0 * ldo);
    std::vector<float> dq(S * ldo), dk(S * KV), dv(S * KV);
    AttnShape ws_shape = s;  // dk, dv compact [S, KV]
    ws_shape.ldk = ws_shape.ldv = KV;
    std::vector<float> kc(S * KV), vc(S * KV);
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < KV; ++i)
        kc[t * KV + i] = k[t * s.ldk + i], vc[t * KV + i] = v[t * s.ldv + i];
    bwd(ws_shape, q, kc.data(), vc.data(), o.data(), lse.data(), dout.data(), p.seg.data(),
        dq.data(), dk.data(), dv.data(), delta.data(), ws.data());
    // The chunk's backward adds onto 1s.
    AttnShape cb = cs;
    cb.ldk = cb.ldv = KV;
    cb.accumulate = true;
    std::vector<float> cdq(n * ldo), cdk(cs.Sk * KV, 1.f), cdv(cs.Sk * KV, 1.f), cdelta(Hq * n);
    bwd(cb, q + q0 * s.ldq, kc.data(), vc.data(), co.data(), clse.data(), dout.data() + q0 * ldo,
        p.seg.data() + q0, cdq.data(), cdk.data(), cdv.data(), cdelta.data(), cws.data());
    expect_close(what + " dq", cdq,
                 std::vector<double>(dq.begin() + q0 * ldo, dq.begin() + (q0 + n) * ldo), rtol,
                 atol);
    std::vector<double> want_dk(dk.begin(), dk.begin() + cs.Sk * KV),
        want_dv(dv.begin(), dv.begin() + cs.Sk * KV);
    for (double& x : want_dk) x += 1;
    for (double& x : want_dv) x += 1;
    expect_close(what + " dk", cdk, want_dk, rtol, atol);
    expect_close(what + " dv", cdv, want_dv, rtol, atol);
  }
}

TEST(AttentionChunkTest, QueriesOfALongerRowMatchTheWholeRow) { chunk_case(false); }
TEST(AttentionChunkTest, Bf16QueriesOfALongerRowMatchTheWholeRow) { chunk_case(true); }

}  // namespace
}  // namespace titan::ops
