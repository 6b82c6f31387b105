#include "titan/train/reports.h"

#include <algorithm>
#include <cstdio>

#include "titan/core/cpu.h"
#include "titan/core/log.h"
#include "titan/parallel/context_parallel.h"
#include "titan/parallel/tensor_parallel.h"

namespace titan::train {

namespace {

// The activations' collectives of the tp group against tensor_parallel.h's volume.
void log_tensor_parallel(const config::JobConfig& cfg, const dist::ParallelDims& dims,
                         const models::Model& model, const RunTotals& r) {
  const models::ModelDims md = model.dims();
  parallel::TpMoe moe;  // the routing weights' shape [T, top_k], the gate's [E, D]
  moe.is_moe = md.moe_layer;
  moe.layers = std::count(md.moe_layer.begin(), md.moe_layer.end(), true);
  moe.experts = md.experts;
  moe.top_k = md.top_k;
  moe.ep_local = dims.ep > 1;
  moe.aux = model.routing() && model.routing()->aux_loss_coef().has_value();
  const auto& t = cfg.training;
  const double theory = parallel::TensorParallel::theory_bytes(
      cfg, dims.tp, md.layers, md.dim, md.head_dim, t.local_batch_size * t.seq_len / dims.cp,
      r.microbatches, moe);
  const double sent = static_cast<double>(r.tp_bytes) / r.steps;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "Tensor parallelism per step and rank: %.3f MiB sent, %.3f MiB in theory for TP "
                "%lld%s (tp ratio %.4f), %.1f ms in the collectives (waiting for the other ranks "
                "included)",
                sent / 1048576.0, theory / 1048576.0, static_cast<long long>(dims.tp),
                dims.sp ? " with SP" : "", sent / theory, 1e3 * r.tp_seconds / r.steps);
  log::info(buf);
}

// The keys' and values' collectives of the cp group against context_parallel.h's volume.
void log_context_parallel(const config::JobConfig& cfg, const dist::ParallelDims& dims,
                          const models::Model& model, const RunTotals& r) {
  const models::ModelDims md = model.dims();
  const auto& t = cfg.training;
  const double theory = parallel::context_parallel_theory_bytes(
      dims.cp, md.layers, 2 * md.kv_heads / dims.tp * md.head_dim, t.local_batch_size, t.seq_len,
      r.microbatches, cfg.activation_checkpoint.mode == "full");
  const double sent = static_cast<double>(r.cp_bytes) / r.steps;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "Context parallelism per step and rank: %.3f MiB sent, %.3f MiB in theory for CP "
                "%lld (cp ratio %.4f), %.1f ms in the collectives (waiting for the other ranks "
                "included)",
                sent / 1048576.0, theory / 1048576.0, static_cast<long long>(dims.cp),
                sent / theory, 1e3 * r.cp_seconds / r.steps);
  log::info(buf);
}

// FSDP's and the replicas' parameter and gradient traffic, expert parallelism's dispatch, and
// FSDP's time in its collectives.
void log_data_parallel(const dist::ParallelDims& dims, const models::Model& model,
                       const parallel::Fsdp* fsdp, const RunTotals& r) {
  // Bytes this rank sent in the step's parameter gathers and gradient reductions, per step,
  // against the ring-algorithm volume of the layout: FSDP's per-unit all-gathers and
  // reduce-scatters within the shard group (parallel::Fsdp::theory_bytes_per_step), the
  // all-reduce across R replicas 2·(R−1)/R of the shard's bytes (the norm's scalar is left out).
  const double steps = r.steps;
  const double R = static_cast<double>(dims.dp_replicate);
  const double shard = 4.0 * static_cast<double>(fsdp ? fsdp->shard_len() : model.num_params());
  const double theory =
      (fsdp ? fsdp->theory_bytes_per_step(r.microbatches) : 0.0) + 2.0 * (R - 1) / R * shard;
  const double sent = static_cast<double>(r.dp_bytes) / steps;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "Communication per step and rank (gradients and parameters): %.3f MiB sent, "
                "%.3f MiB in theory for %s (ratio %.4f)",
                sent / 1048576.0, theory / 1048576.0, dims.describe().c_str(), sent / theory);
  log::info(buf);
  if (dims.ep > 1) {
    const parallel::DispatchSeconds& t = r.ep_seconds;
    std::snprintf(buf, sizeof buf,
                  "Expert parallelism per step and rank: %.3f MiB sent in the token dispatch "
                  "and combine (4 all-to-alls of the routed rows per MoE layer and microbatch), "
                  "%.1f ms in them (waiting for the other ranks included), %.1f ms in the "
                  "experts op on the rows received",
                  static_cast<double>(r.ep_bytes) / steps / 1048576.0, 1e3 * t.exchange / steps,
                  1e3 * t.experts / steps);
    log::info(buf);
  }
  if (fsdp) {
    std::snprintf(buf, sizeof buf,
                  "FSDP: %.1f ms per step in parameter gathers and gradient reduce-scatters, "
                  "%.1f ms of it not hidden behind compute (overlap %.0f%%); resident memory "
                  "now %.3f GiB",
                  1e3 * fsdp->comm_seconds() / steps, 1e3 * fsdp->exposed_seconds() / steps,
                  100.0 * (1.0 - fsdp->exposed_seconds() / std::max(fsdp->comm_seconds(), 1e-12)),
                  static_cast<double>(cpu::current_rss_bytes()) / (1024.0 * 1024.0 * 1024.0));
    log::info(buf);
  }
}

}  // namespace

void log_parallel_reports(const config::JobConfig& cfg, const dist::ParallelDims& dims,
                          const models::Model& model, const parallel::Fsdp* fsdp,
                          const RunTotals& r) {
  if (r.steps <= 0) return;
  if (dims.tp > 1) log_tensor_parallel(cfg, dims, model, r);
  if (dims.cp > 1) log_context_parallel(cfg, dims, model, r);
  if (dims.batch() > 1 || dims.sharded()) log_data_parallel(dims, model, fsdp, r);
}

}  // namespace titan::train
