// Tensor parallelism in the trainer (tensor_parallel.h).
#include "titan/parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "titan/core/cpu.h"
#include "titan/core/error.h"

namespace titan::parallel {

namespace {
// Elements of rank r's slice of p.
int64_t slice_numel(const models::ParamInfo& p, int r, int P) {
  int64_t n = 1;
  for (size_t i = 0; i < p.shape.size(); ++i)
    n *= static_cast<int>(i) == p.split_dim ? models::shard_range(p.shape[i], r, P).rows
                                            : p.shape[i];
  return n;
}

std::map<std::string, const models::ParamInfo*> by_fqn(const models::Model& m) {
  std::map<std::string, const models::ParamInfo*> out;
  for (const auto& p : m.params())
    if (!p.alias) out[p.fqn] = &p;
  return out;
}

const models::ParamInfo& whole_of(const std::map<std::string, const models::ParamInfo*>& full,
                                  const models::ParamInfo& p) {
  const auto it = full.find(p.fqn);
  check(it != full.end(), "tensor parallelism: the whole model has no parameter " + p.fqn);
  return *it->second;
}
}  // namespace

const std::vector<int64_t>& TensorParallel::counts(int64_t n) {
  counts_.assign(static_cast<size_t>(tp_.size()), n);  // no allocation after the first call
  return counts_;
}

void TensorParallel::all_reduce(float* x, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  data_.all_reduce(x, n);
}

void TensorParallel::all_reduce_max(float* x, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  data_.all_reduce(x, n, dist::ReduceOp::max);
}

void TensorParallel::all_reduce_f64(double* x, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  tp_.all_reduce(x, n);
}

void TensorParallel::all_gather(const float* in, float* out, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (mem_.host())
    std::memcpy(out + tp_.rank() * n, in, bytes);
  else
    mem_.copy(out + tp_.rank() * n, in, bytes);
  data_.all_gather(out, counts(n));
}

void TensorParallel::reduce_scatter(const float* in, float* out, int64_t n) {
  cpu::ScopedSeconds t{seconds_};
  data_.reduce_scatter(in, out, counts(n));
}

namespace {
// A slice along dimension k of a row-major tensor: for each of `outer` = Π shape[:k] indices, a
// contiguous run of len·inner values (inner = Π shape[k+1:]) at begin·inner in the whole's block
// of extent·inner.
struct Strides {
  int64_t outer = 1, inner = 1, extent = 1;
};
Strides strides(const models::ParamInfo& p) {
  Strides s;
  const auto k = static_cast<size_t>(p.split_dim);
  for (size_t i = 0; i < p.shape.size(); ++i) {
    if (i < k) s.outer *= p.shape[i];
    if (i > k) s.inner *= p.shape[i];
  }
  s.extent = p.shape[k];
  return s;
}
}  // namespace

void TensorParallel::gather(dist::Communicator& tp, dist::Communicator& ep,
                            const models::Model& local, const float* local_buf,
                            const models::Model& full, float* full_buf) {
  const auto whole = by_fqn(full);
  std::vector<float> all;
  for (const auto& p : local.params()) {
    if (p.alias) continue;
    const models::ParamInfo& w = whole_of(whole, p);
    float* dst = full_buf + w.offset;
    if (p.split_dim < 0) {  // replicated: the same on every rank
      std::copy_n(local_buf + p.offset, p.numel, dst);
      continue;
    }
    dist::Communicator& g = p.split_over_ep ? ep : tp;
    const int P = g.size();
    std::vector<int64_t> counts(static_cast<size_t>(P));
    int64_t at = 0;
    for (int r = 0; r < P; ++r) {
      counts[static_cast<size_t>(r)] = slice_numel(p, r, P);
      if (r < g.rank()) at += counts[static_cast<size_t>(r)];
    }
    const Strides st = strides(p);
    if (st.outer == 1) {  // rank blocks in order are the row-major tensor
      std::copy_n(local_buf + p.offset, p.numel, dst + at);
      g.all_gather(dst, counts);
      continue;
    }
    // Rank r's block [outer, len_r·inner] goes to [begin_r·inner, (begin_r + len_r)·inner) of
    // each outer index.
    all.assign(static_cast<size_t>(w.numel), 0.0f);
    std::copy_n(local_buf + p.offset, p.numel, all.data() + at);
    g.all_gather(all.data(), counts);
    const float* src = all.data();
    for (int r = 0; r < P; ++r) {
      const models::ShardRange c = models::shard_range(st.extent, r, P);
      const int64_t run = c.rows * st.inner;
      for (int64_t o = 0; o < st.outer; ++o)
        std::copy_n(src + o * run, run, dst + (o * st.extent + c.begin) * st.inner);
      src += st.outer * run;
    }
  }
}

void TensorParallel::slice(const models::Model& local, float* local_buf, const models::Model& full,
                           const float* full_buf) {
  const auto whole = by_fqn(full);
  for (const auto& p : local.params()) {
    if (p.alias) continue;
    const float* src = full_buf + whole_of(whole, p).offset;
    float* dst = local_buf + p.offset;
    if (p.split_dim < 0) {
      std::copy_n(src, p.numel, dst);
      continue;
    }
    const Strides st = strides(p);
    const int64_t run = p.local_len * st.inner;
    for (int64_t o = 0; o < st.outer; ++o)
      std::copy_n(src + (o * st.extent + p.local_begin) * st.inner, run, dst + o * run);
  }
}

void TensorParallel::copy_buffers(const models::Model& from, const models::Model& to) {
  const auto dst = to.buffers();
  for (const auto& b : from.buffers()) {
    const auto it = std::find_if(dst.begin(), dst.end(),
                                 [&](const models::BufferInfo& x) { return x.fqn == b.fqn; });
    check(it != dst.end() && it->shape == b.shape,
          "tensor parallelism: the whole model has no buffer " + b.fqn + " of its shape");
    int64_t n = 1;
    for (int64_t x : b.shape) n *= x;
    std::copy_n(b.data, n, it->data);
  }
}

double TensorParallel::theory_bytes(const config::JobConfig& cfg, int64_t P, int64_t layers,
                                    int64_t D, int64_t d, int64_t T, int64_t microbatches,
                                    const TpMoe& moe) {
  const bool sp = cfg.parallelism.enable_sequence_parallel;
  const double f = static_cast<double>(P - 1) / static_cast<double>(P);
  const double A = f * 4.0 * static_cast<double>(T * D);  // one all-gather / reduce-scatter
  const double R = 2.0 * f * 4.0;                         // an all-reduce, per value
  // Per block and direction: SP 2 gathers + 2 reduce-scatters; else 2 all-reduces of T·D.
  const double block = sp ? 4.0 * A : 2.0 * R * static_cast<double>(T * D);
  // The collectives a recomputation repeats: a fully checkpointed block's forward; with "op" the
  // norms' all-gathers (sequence parallelism).
  const models::AcPolicy ac = models::AcPolicy::from_config(
      cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option);
  // A local MoE layer (EP over the tp ranks) under SP moves only its attention half.
  const bool local = moe.ep_local && sp;
  auto is_moe = [&](int64_t l) {
    return static_cast<size_t>(l) < moe.is_moe.size() && moe.is_moe[static_cast<size_t>(l)];
  };
  double recompute = 0;
  for (int64_t l = 0; l < layers; ++l)
    recompute += ac.full_block(l) ? (local && is_moe(l) ? block / 2 : block) : 0.0;
  if (ac.mode == models::AcPolicy::Mode::op && sp)
    recompute = static_cast<double>(2 * layers - (local ? moe.layers : 0)) * A;
  const double blocks = static_cast<double>(layers) * 2.0 * block -
                        (local ? static_cast<double>(moe.layers) * block : 0.0);
  // The embedding (forward reduce, backward gather) and the final norm (forward gather,
  // backward reduce): one each way, as a block's single step.
  const double ends = sp ? 4.0 * A : 2.0 * R * static_cast<double>(T * D);
  const double loss = R * 3.0 * static_cast<double>(T);  // max, sum and target logit per token
  const double norms =
      R * (static_cast<double>(layers) * ((sp ? 2.0 * D : 0.0) + 2.0 * d) + (sp ? D : 0.0));
  // MoE: with the experts' hidden units split, the routing weights' gradient [T, top_k]; with
  // local layers the router weight's gradient [E, D] and the aux-loss statistics (2·E doubles
  // per microbatch), and per step the expert counts (E doubles per layer).
  const double Rd = 2.0 * f * 8.0;  // an all-reduce, per double
  const double E = static_cast<double>(moe.experts), ml = static_cast<double>(moe.layers);
  if (moe.layers > 0)
    check(static_cast<int64_t>(moe.is_moe.size()) == layers, "TpMoe::is_moe: one entry a layer");
  const double routing = moe.ep_local
                             ? R * ml * E * static_cast<double>(D) + (moe.aux ? Rd * 2 * E : 0)
                             : R * ml * static_cast<double>(T * moe.top_k);
  const double counts = moe.ep_local ? Rd * ml * E : 0.0;
  return static_cast<double>(microbatches) * (blocks + recompute + ends + loss + norms + routing) +
         counts;
}

}  // namespace titan::parallel
