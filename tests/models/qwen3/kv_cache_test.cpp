// Generation's cached forward (Qwen3Model::forward_cached) against the real Hugging Face
// transformers: the fixtures of tools/make_hf_fixtures.py hold transformers' fp32 logits of two
// rows of 16 tokens (plain causal, positions 0..15). titan feeds the same tokens in pieces — a
// prompt of each row at once, then a call mixing both rows, then one token per row per call —
// and every logits row it returns must be transformers' row for that token's position.
// Tolerance: max |Δ| <= 1e-4, as the full-forward parity test (logits O(10), fp32 on both sides,
// different summation orders).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/models/qwen3/hf_config.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict_adapter.h"

namespace titan::qwen3 {
namespace {

std::string fixture_dir(const std::string& name) {
  return std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
}

class KvCacheParity : public ::testing::TestWithParam<std::string> {};

// Feeds the fixture's two rows in pieces through model `m` and returns the largest |Δ| of the
// returned logits rows against transformers' (fp32); *top = max |reference logit|.
struct Piecewise {
  double worst = 0, top = 0;
  int64_t rows = 0;
};
Piecewise run_piecewise(const std::string& name, DType compute) {
  const std::string dir = fixture_dir(name);
  const Qwen3Args args = args_from_hf_config(dir);
  const auto expected = ckpt::SafetensorsSet::open(dir + "/expected.safetensors");
  const ckpt::TensorView* ids_t = expected.find("input_ids");
  check(ids_t != nullptr, "fixture without input_ids");
  const int64_t B = ids_t->shape[0], S = ids_t->shape[1], V = args.vocab_size;
  check(B == 2, "the fixture has two rows");
  std::vector<int32_t> ids(static_cast<size_t>(B * S));
  for (int64_t i = 0; i < B * S; ++i) {
    int64_t v;
    std::memcpy(&v, ids_t->data + 8 * i, 8);
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  std::vector<float> ref(static_cast<size_t>(B * S * V));
  expected.read_f32("logits", {B, S, V}, ref.data());

  Qwen3Model m(args, {.max_seq = S, .compute = compute});
  load_hf_weights(m, ckpt::SafetensorsSet::open(dir), dir);
  auto cache = m.new_kv_cache(B, S);
  Piecewise res;
  for (float x : ref) res.top = std::max(res.top, static_cast<double>(std::fabs(x)));
  std::vector<int64_t> next(static_cast<size_t>(B), 0);  // per row: tokens fed so far
  double& worst = res.worst;
  int64_t& checked = res.rows;
  // Feeds `count[r]` more tokens of each row r in one call (rows in the given order) and checks
  // each returned row against transformers' logits at that row's last fed position.
  auto feed = [&](std::vector<std::pair<int64_t, int64_t>> parts) {
    std::vector<int32_t> tok, seq;
    for (auto [r, count] : parts)
      for (int64_t i = 0; i < count; ++i) {
        tok.push_back(ids[static_cast<size_t>(r * S + next[static_cast<size_t>(r)]++)]);
        seq.push_back(static_cast<int32_t>(r));
      }
    std::vector<float> out(parts.size() * static_cast<size_t>(V));
    const int64_t rows = m.forward_cached(*cache, tok.data(), seq.data(),
                                          static_cast<int64_t>(tok.size()), out.data());
    ASSERT_EQ(rows, static_cast<int64_t>(parts.size()));
    for (size_t p = 0; p < parts.size(); ++p) {
      const int64_t r = parts[p].first, pos = next[static_cast<size_t>(r)] - 1;
      EXPECT_EQ(cache->length(r), pos + 1);
      for (int64_t v = 0; v < V; ++v)
        worst =
            std::max(worst, static_cast<double>(std::fabs(
                                out[p * V + v] - ref[static_cast<size_t>((r * S + pos) * V + v)])));
      ++checked;
    }
  };
  feed({{0, 5}});
  feed({{1, 9}});
  feed({{0, 3}, {1, 1}});
  while (next[0] < S || next[1] < S) {
    std::vector<std::pair<int64_t, int64_t>> step;
    for (int64_t r : {1, 0})
      if (next[static_cast<size_t>(r)] < S) step.push_back({r, 1});
    feed(step);
  }
  // A full sequence refuses more; clear() starts it again.
  std::vector<float> out(static_cast<size_t>(V));
  const int32_t tok = 1, seq0 = 0;
  EXPECT_THROW(m.forward_cached(*cache, &tok, &seq0, 1, out.data()), Error);
  cache->clear(0);
  EXPECT_EQ(m.forward_cached(*cache, &ids[0], &seq0, 1, out.data()), 1);
  worst = std::max(worst, static_cast<double>(std::fabs(out[0] - ref[0])));
  return res;
}

TEST_P(KvCacheParity, PiecewiseLogitsMatchTransformers) {
  const Piecewise r = run_piecewise(GetParam(), DType::F32);
  EXPECT_LE(r.worst, 1e-4) << r.rows << " logits rows";
  std::printf("[ cached   ] %s: %lld logits rows, max |Δ| vs transformers %.3g\n",
              GetParam().c_str(), static_cast<long long>(r.rows), r.worst);
}

// bf16 mixed precision: the GEMMs on the bf16 weight copy (attention stays fp32 here), within
// the bound of the full-forward bf16 parity test: 2·2⁻⁸·(6L + 1)·max|logit|
// (tests/models/qwen3/hf_parity_test.cpp states its derivation).
TEST_P(KvCacheParity, PiecewiseLogitsInBf16WithinTheBf16Bound) {
  const Piecewise r = run_piecewise(GetParam(), DType::BF16);
  const int64_t layers = args_from_hf_config(fixture_dir(GetParam())).n_layers;
  const double bound = 2.0 / 256.0 * static_cast<double>(6 * layers + 1) * r.top;
  EXPECT_LE(r.worst, bound) << r.rows << " logits rows";
  std::printf("[ cached   ] %s bf16: max |Δ| vs transformers fp32 %.3g (bound %.3g)\n",
              GetParam().c_str(), r.worst, bound);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheParity,
                         ::testing::Values("tied_gqa2", "untied_gqa1", "untied_gqa4", "tied_hd_eq",
                                           "moe_norm", "moe_nonorm_dense1"));

TEST(KvCache, RefusesWhatItCannotServe) {
  const Qwen3Args args = args_from_hf_config(fixture_dir("tied_gqa2"));
  Qwen3Model m(args, 1, 8);
  EXPECT_THROW(m.new_kv_cache(1, 9), Error);  // beyond the model's positions
  auto cache = m.new_kv_cache(2, 8);
  std::vector<float> out(static_cast<size_t>(2 * args.vocab_size));
  const int32_t bad_tok = static_cast<int32_t>(args.vocab_size), tok = 3, bad_seq = 2, seq = 0;
  EXPECT_THROW(m.forward_cached(*cache, &bad_tok, &seq, 1, out.data()), Error);
  EXPECT_THROW(m.forward_cached(*cache, &tok, &bad_seq, 1, out.data()), Error);
  std::vector<int32_t> many(9, tok), seqs(9, 0);
  EXPECT_THROW(m.forward_cached(*cache, many.data(), seqs.data(), 9, out.data()), Error);
  EXPECT_EQ(cache->length(0), 0);  // nothing appended by a refused call
}

}  // namespace
}  // namespace titan::qwen3
