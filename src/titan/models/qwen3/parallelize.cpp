#include "titan/models/qwen3/parallelize.h"

#include "titan/core/error.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/redistribute.h"

namespace titan::qwen3 {

namespace {
bool ends_with(const std::string& s, const char* tail) {
  const std::string t(tail);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
std::string tp_size(int64_t tp) {
  return "tp_size (" + std::to_string(tp) + ") (parallelism.tensor_parallel_degree";
}
}  // namespace

void check_parallel_layout(const Qwen3Args& a, const ParallelLayout& p, const std::string& source) {
  const int64_t tp = p.tp, ep = p.ep;
  if (tp > 1) {
    check(a.n_heads % tp == 0,
          "n_heads (" + std::to_string(a.n_heads) + ") must be divisible by " + tp_size(tp) + ")");
    check(a.n_kv_heads % tp == 0, "n_kv_heads (" + std::to_string(a.n_kv_heads) +
                                      ") must be divisible by " + tp_size(tp) + ")");
    check(a.n_moe_layers() == a.n_layers || a.hidden_dim % tp == 0,
          "hidden_dim (" + std::to_string(a.hidden_dim) + ") must be divisible by " + tp_size(tp) +
              ")");
    check(!a.is_moe() || ep > 1 || a.moe_hidden_dim % tp == 0,
          "moe_hidden_dim (" + std::to_string(a.moe_hidden_dim) + ") must be divisible by " +
              tp_size(tp) + ": the experts' hidden units are split)");
    check(!p.sequence_parallel || p.tokens % tp == 0,
          "sequence parallelism needs the tokens per microbatch (local_batch_size x seq_len = " +
              std::to_string(p.tokens) + ") divisible by tp_size (" + std::to_string(tp) +
              "); change training.seq_len or training.local_batch_size, or pass "
              "--parallelism.enable_sequence_parallel false");
    check(ep == 1 || p.tokens % tp == 0,
          "expert parallelism over the tensor-parallel ranks routes 1/tp_size of each "
          "microbatch's tokens per rank: local_batch_size x seq_len (" +
              std::to_string(p.tokens) + ") must be divisible by tp_size (" + std::to_string(tp) +
              "); change training.seq_len or training.local_batch_size");
  }
  if (ep > 1) {
    check(a.is_moe(), "parallelism.expert_parallel_degree " + std::to_string(ep) + ": " + source +
                          " has no experts (expert parallelism is for MoE models)");
    check(a.num_experts % ep == 0, "num_experts (" + std::to_string(a.num_experts) +
                                       ") must be divisible by ep (" + std::to_string(ep) +
                                       ") (parallelism.expert_parallel_degree)");
  }
}

models::ParamInfo::Tp tp_placement(const std::string& fqn) {
  using Tp = models::ParamInfo::Tp;
  if (fqn.find(".moe.experts.") != std::string::npos) return Tp::experts;
  for (const char* c : {"tok_embeddings.weight", "lm_head.weight", ".wq.weight", ".wk.weight",
                        ".wv.weight", ".w1.weight", ".w3.weight"})
    if (ends_with(fqn, c)) return Tp::colwise;
  if (ends_with(fqn, ".wo.weight") || ends_with(fqn, ".w2.weight")) return Tp::rowwise;
  return Tp::replicate;
}

int tp_split_dim(const std::string& fqn) {
  using Tp = models::ParamInfo::Tp;
  switch (tp_placement(fqn)) {
    case Tp::colwise:
      return 0;
    case Tp::rowwise:
      return 1;
    case Tp::experts:  // [E, Fm, D] w1/w3 and [E, D, Fm] w2 split on their hidden units
      return ends_with(fqn, ".w2") ? 2 : 1;
    default:
      return -1;
  }
}

models::TensorSize::Tp tp_split(std::string name) {
  using Tp = models::TensorSize::Tp;
  if (name.rfind("recompute.", 0) == 0) name = name.substr(10);
  for (const char* s : {"x", "attention_norm.rstd", "h", "ffn_norm.rstd", "h_final", "norm.rstd"})
    if (name == s) return Tp::sequence;
  for (const char* f :
       {"attention.qkv", "attention.q", "attention.k", "attention.q_norm.rstd",
        "attention.k_norm.rstd", "attention.out", "attention.lse", "feed_forward.w13",
        "feed_forward.hidden", "grad.qkv", "grad.q", "grad.k", "grad.attention_out", "grad.w13",
        "grad.hidden", "attention.scratch", "attention.delta", "loss.scratch"})
    if (name == f) return Tp::feature;
  return Tp::full;
}

SliceWidths slice_widths(const Qwen3Args& a, const models::TpSlice& tp) {
  const int64_t P = tp.size, d = a.head_dim;
  SliceWidths w{};
  w.hq = a.n_heads / P, w.hkv = a.n_kv_heads / P, w.q = w.hq * d, w.kv = w.hkv * d;
  w.qkv = w.q + 2 * w.kv, w.f = a.hidden_dim / P;
  w.fm = tp.ep_active() ? a.moe_hidden_dim : a.moe_hidden_dim / P;
  const models::ShardRange vs = tp.tp_shard(a.vocab_size);
  w.v0 = vs.begin, w.vl = vs.rows;
  return w;
}

void parallelize(models::Model& model, models::TpHooks* tp) {
  if (!model.tp_slice().active()) return;
  auto* m = dynamic_cast<Qwen3Model*>(&model);
  check(m != nullptr && tp != nullptr,
        "Qwen3's tensor parallelism applies to a Qwen3 model built on a tp slice, with its "
        "group's collectives");
  const models::TpSlice s = m->tp_slice();
  m->set_tp_group(tp, models::TpRegion{tp, s.size, s.sequence_parallel, m->args().dim});
}

void context_parallel(models::Model& model, const models::ContextAttention& cp) {
  auto* m = dynamic_cast<Qwen3Model*>(&model);
  check(m != nullptr && cp.hooks() != nullptr,
        "Qwen3's context parallelism applies to a Qwen3 model, with its group's collectives");
  m->set_cp_group(cp);
}

}  // namespace titan::qwen3
