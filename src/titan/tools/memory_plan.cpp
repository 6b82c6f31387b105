#include "titan/tools/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "titan/core/buffer.h"
#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/models/registry.h"
#include "titan/ops/backend.h"
#include "titan/ops/device.h"
#include "titan/ops/gemm.h"

namespace titan::tools {
namespace {
std::string gib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return b;
}
}  // namespace

int64_t MemoryPlan::total() const {
  int64_t t = 0;
  for (const auto& l : lines) t += l.bytes;
  return t;
}

std::string MemoryPlan::format() const {
  std::string out = layout == "single process" ? "memory plan (per process):\n"
                                               : "memory plan (per rank of " + layout + "):\n";
  char buf[160];
  for (const auto& l : lines) {
    std::snprintf(buf, sizeof buf, "  %-60s %14s\n", l.what.c_str(), gib(l.bytes).c_str());
    out += buf;
  }
  if (ops::device(device).host)
    std::snprintf(buf, sizeof buf, "  %-60s %14s  (machine: %s)\n", "total", gib(total()).c_str(),
                  gib(cpu::total_memory_bytes()).c_str());
  else
    std::snprintf(buf, sizeof buf, "  %-60s %14s  (%s memory: %s)\n", "total", gib(total()).c_str(),
                  device.c_str(), capacity > 0 ? gib(capacity).c_str() : "unknown here");
  return out + buf;
}

MemoryPlan plan_memory(const config::JobConfig& cfg) {
  const auto& t = cfg.training;
  // A layout given by its degrees (titan plan runs in one process): the shard degree as given,
  // -1 (the ranks left over) counting as 1.
  const dist::ParallelDims dims = dist::ParallelDims::for_plan(cfg);
  models::BuildOptions o;
  o.batch = t.local_batch_size;
  o.seq_len = t.seq_len;
  o.cp = dims.cp;
  o.loss_chunks = cfg.loss.num_chunks;
  o.ac = models::AcPolicy::from_config(cfg.activation_checkpoint.mode,
                                       cfg.activation_checkpoint.selective_ac_option);
  o.allocate = false;
  o.log_overrides = false;  // the build that follows logs them
  o.bytes_per_param = 0;    // the plan reports what does not fit
  o.device = t.device;
  models::validate_model_config(cfg);  // heads and experts divisible by tp and ep
  return plan_memory(cfg, *models::build_model(cfg, o), dims);
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements of a parameter on one rank before FSDP sharding: its tensor/expert-parallel slice.
int64_t tp_local(const models::ParamInfo& q, const dist::ParallelDims& d) {
  using Tp = models::ParamInfo::Tp;
  switch (q.tp) {
    case Tp::replicate:
      return q.numel;
    case Tp::colwise:
    case Tp::rowwise:
      return ceil_div(q.numel, d.tp);
    case Tp::experts:
      return ceil_div(q.numel, d.ep > 1 ? d.ep : d.tp);
  }
  return q.numel;
}

int64_t tp_local(const models::TensorSize& s, const dist::ParallelDims& d) {
  using Tp = models::TensorSize::Tp;
  const bool split = s.tp == Tp::feature
                         ? (s.role != models::TensorSize::Role::loss_scratch || d.loss_parallel)
                         : s.tp == Tp::sequence && d.sp;
  return split ? ceil_div(s.aligned_bytes(), 64 * d.tp) * 64 : s.aligned_bytes();
}
}  // namespace

MemoryPlan plan_memory(const config::JobConfig& cfg, const models::Model& m,
                       const dist::ParallelDims& dims) {
  const auto& t = cfg.training;
  const int64_t dp_shard = dims.fsdp();
  // Parameters per rank: the tp/ep slice of each, then its FSDP shard (experts under EP over
  // efsdp); per unit, the slices a rank gathers.
  const auto units = m.store().units();
  std::vector<int64_t> unit_local(units.size(), 0);
  int64_t dense = 0, experts = 0, whole = 0;
  for (const auto& q : m.params()) {
    if (q.alias) continue;
    const int64_t n = tp_local(q, dims);
    (q.tp == models::ParamInfo::Tp::experts ? experts : dense) += n;
    whole += q.numel;
    // Under EP a rank holds and gathers (over efsdp) only its own experts, as torchtitan does.
    unit_local[static_cast<size_t>(q.group)] += n;
  }
  const int64_t local = dense + experts;  // a rank's slices, unsharded
  const int64_t ps =
      4 * (ceil_div(dense, dp_shard) + ceil_div(experts, dims.ep > 1 ? dims.efsdp() : dp_shard));
  int64_t saved = 0, work = 0, n_saved = 0;
  for (const auto& s : m.activation_table()) {
    (s.saved ? saved : work) += tp_local(s, dims);
    n_saved += s.saved;
  }
  // Expert parallelism's dispatch (train/expert_parallel.h), at balanced routing (each rank
  // receives as many rows as it sends, T·K per layer; up to ep times more when every token picks
  // one rank's experts): per MoE layer the rows received [T·K, D] with their weights and expert
  // ids, kept to the backward (one layer's under full AC, recomputed); once, the exchange
  // buffers (rows sent, received, returned, their gradients: ≈ 4·T·K·(D + 1)).
  int64_t ep_bytes = 0;
  if (dims.ep > 1) {
    const int64_t D = m.dims().dim;
    int64_t rows = 0;
    for (const auto& s : m.activation_table()) {
      if (s.role != models::TensorSize::Role::routing_weights) continue;
      rows = std::max(rows, s.numel());
      if (s.saved || ep_bytes == 0) ep_bytes += 4 * s.numel() * (D + 2);
    }
    ep_bytes += 4 * 4 * rows * (D + 1);
  }
  const bool bf16 = t.mixed_precision_param == "bfloat16";
  int64_t largest = 0, loss_scratch = 0;  // sizes behind the converting path's copies
  for (const auto& q : m.params()) largest = std::max(largest, q.numel);
  for (const auto& s : m.activation_table())
    if (s.role == models::TensorSize::Role::loss_scratch) loss_scratch = s.numel();
  const int64_t global = t.global_batch_size == -1 ? t.local_batch_size : t.global_batch_size;
  const int64_t step_tokens = global * t.seq_len;
  const ops::Device& dev = ops::device(t.device);
  MemoryPlan plan;
  plan.layout = dims.describe();
  const bool sliced = dims.tp > 1;  // under EP the experts are FSDP-sharded like the rest
  const std::string shard =
      std::string("; ") + (sliced ? "TP slice" : "") + (sliced && dp_shard > 1 ? ", " : "") +
      (dp_shard > 1 ? "1/" + std::to_string(dp_shard) + " shard" : std::string()) + ")";
  const bool split = sliced || dp_shard > 1;
  // optimizer.state_dtype: two fp32 moments per parameter (8 bytes), two bf16 ones (4), or two
  // 8-bit codes (2) and two fp32 scales per block of 256 (at most one block more per parameter
  // than the elements need: optim/state.h).
  const std::string& sd = cfg.optimizer.moments_dtype();
  const std::string state = sd == "bfloat16" ? "bf16" : sd == "int8" ? "8-bit block-wise" : "fp32";
  const int64_t state_bytes =
      sd == "bfloat16" ? ps
      : sd == "int8"   ? ps / 2 + 8 * (ps / 4 / 256 + static_cast<int64_t>(m.params().size()))
                       : 2 * ps;
  // optimizer.early_step_in_backward (no FSDP): a unit's gradient lives from its first write to
  // its update: the largest unit's at a time, and a tied embedding's from the head's forward on.
  bool tied = false;  // lm_head is the embedding's storage (unit 0)
  for (const auto& q : m.params()) tied = tied || q.alias;
  int64_t in_backward = 0;
  const bool grads_by_unit = cfg.optimizer.early_step_in_backward && dp_shard == 1;
  if (grads_by_unit) {
    for (size_t i = tied ? 1 : 0; i < units.size(); ++i)
      in_backward = std::max(in_backward, unit_local[i]);
    in_backward = 4 * (in_backward + (tied ? unit_local[0] : 0));
  }
  // training.dtype bfloat16: the projections' masters are bf16 (without FSDP their compute copy,
  // its line below; under FSDP a shard of their own), fp32 masters remain for the rest
  // (ParamStore::master_bytes), and each update widens one unit's (FSDP: one block's) bf16
  // masters to fp32.
  const bool pure_bf16 = t.dtype == "bfloat16";
  const double local_share =
      static_cast<double>(local) / static_cast<double>(std::max<int64_t>(1, whole));
  const double rank_share = local_share / static_cast<double>(dp_shard);  // TP slice, FSDP shard
  int64_t bf16_masters = 0;
  for (const auto& r : m.store().copy_only()) bf16_masters += r.len;
  plan.lines = {
      {"process at start (code, libraries)", cpu::current_rss_bytes()},
      // LoRA: the adapters are the parameters below; the frozen base holds its weights alone
      // (under bf16 the projections as their compute copy only, counted on that line)
      {bf16 ? "frozen base weights (fp32 norms, embedding; LoRA)"
            : "frozen base weights (fp32; LoRA)",
       models::frozen_bytes(m)},
      pure_bf16
          ? MemoryPlan::Line{"parameters (fp32 masters: norms, embedding, experts" +
                                 (split ? shard : ")"),
                             static_cast<int64_t>(static_cast<double>(m.store().master_bytes()) *
                                                  rank_share)}
          : MemoryPlan::Line{split ? "parameters (fp32 master" + shard : "parameters (fp32 master)",
                             ps},
      grads_by_unit
          ? MemoryPlan::Line{"gradients (fp32; one unit at a time, early_step_in_backward)",
                             in_backward}
          : MemoryPlan::Line{split ? "gradients (fp32, reduced" + shard : "gradients (fp32)", ps},
      {split ? "optimizer state (AdamW; " + state + shard
             : "optimizer state (AdamW exp_avg, exp_avg_sq; " + state + ")",
       state_bytes},
  };
  if (bf16 && dp_shard == 1)  // FSDP: per unit, in the gathered units' line
    plan.lines.push_back(
        {"bf16 compute copy of the weights",
         static_cast<int64_t>(static_cast<double>(models::compute_copy_bytes(m)) * local_share)});
  if (pure_bf16 && dp_shard > 1)
    plan.lines.push_back(
        {"bf16 masters (projections" + shard,
         static_cast<int64_t>(2.0 * static_cast<double>(bf16_masters) * rank_share)});
  // Sharded or sliced, a checkpoint's save reads them widened, all at once (more than one unit's
  // update widens); whole, it reads them widened slice by slice as it writes (the line below).
  const bool save_widens = split || dims.ep > 1;
  if (pure_bf16 && cfg.checkpoint.enable && save_widens)
    plan.lines.push_back(
        {"bf16 masters: all widened to fp32 while a checkpoint is saved",
         static_cast<int64_t>(4.0 * static_cast<double>(bf16_masters) * rank_share)});
  else if (pure_bf16)
    plan.lines.push_back(
        {dp_shard > 1 ? "bf16 masters: one block widened to fp32 for its update"
                      : "bf16 masters: one unit widened to fp32 for its update",
         static_cast<int64_t>(4.0 * static_cast<double>(m.store().largest_widened_unit()) *
                              rank_share)});
  // A save of the whole model converts what it writes (bf16 masters widened, an export's dtype,
  // 8-bit moments decoded) one slice of at most 64 MiB at a time, through 4 MiB of fp32.
  if (cfg.checkpoint.enable && !save_widens)
    plan.lines.push_back({"checkpoint save: one slice converted at a time",
                          std::min<int64_t>(int64_t{64} << 20, 4 * largest) +
                              std::min<int64_t>(int64_t{4} << 20, 4 * largest)});
  plan.lines.insert(
      plan.lines.end(),
      {
          {"saved activations (" + std::to_string(n_saved) + " tensors, AC " +
               models::AcPolicy::from_config(cfg.activation_checkpoint.mode,
                                             cfg.activation_checkpoint.selective_ac_option)
                   .describe() +
               ")",
           saved},
          {"workspaces (shared by the layers)", work},
          {"step batches (input, labels, positions; int32)", 3 * 4 * step_tokens},
      });
  if (ep_bytes > 0)
    plan.lines.insert(plan.lines.end() - 1,
                      {"expert-parallel dispatch (rows received, exchange buffers)", ep_bytes});
  if (dims.cp > 1) {  // models/context_parallel.h: the whole sequence's k|v gathered, dk|dv
    // summed, the rank-ordered exchange buffer and one row's attention workspace
    const models::ModelDims md = m.dims();
    const int64_t W = 2 * md.kv_heads / dims.tp * md.head_dim, B = t.local_batch_size;
    plan.lines.insert(plan.lines.end() - 1, {"context parallelism: gathered keys and values (fp32)",
                                             4 * W * t.seq_len * (3 * B + B / dims.cp + 1)});
  }
  if (dp_shard > 1) {  // FSDP (train/fsdp.h)
    // Whole at once: the head's group (kept gathered through the step by default; the first and
    // last units' gradients are held from the forward on), the unit being computed and the next
    // one (prefetched weights; the gradient still reducing), weights and gradients (and their
    // bf16 copy).
    int64_t head = unit_local.back(), other = 0;
    if (tied) head += unit_local[0];
    for (size_t i = tied ? 1 : 0; i + 1 < units.size(); ++i) other = std::max(other, unit_local[i]);
    // Given back unit by unit: host pages; a device's granules where it can (core/device.h
    // reserve). Elsewhere the flat buffers stay whole (fsdp.h).
    if (dev.host || ops::backend(t.device, "float32").reserve) {
      plan.lines.push_back({bf16 ? "gathered: head group + 2 largest units (fp32 w+g, bf16)"
                                 : "gathered: head group + 2 largest units (fp32 w+g)",
                            (bf16 ? 10 : 8) * (head + 2 * other)});
      // A device that maps granules: the one two units share stays mapped, in each flat buffer.
      if (dev.granule > 0)
        plan.lines.push_back({"granules shared by adjacent units (" +
                                  std::to_string(dev.granule >> 20) + " MiB, kept mapped)",
                              (bf16 ? 3 : 2) * static_cast<int64_t>(units.size()) * dev.granule});
    } else {
      plan.lines.push_back({bf16 ? "gathered into: whole weights and gradients (fp32 w+g, bf16)"
                                 : "gathered into: whole weights and gradients (fp32 w+g)",
                            (bf16 ? 10 : 8) * local});
    }
    // Native initial weights are loaded whole (a TP/EP rank: its slices whole) before the
    // masters are sharded (a resumed checkpoint is read unit by unit, Hugging Face weights only
    // in the rank's shard); off the CPU into the host copy, not the device's memory.
    const auto& k = cfg.checkpoint;
    if (!k.initial_load_path.empty() && !k.initial_load_in_hf && dev.host)
      plan.lines.push_back({"initial weights: whole before sharding (given back)", 4 * local});
  }
  if (bf16 && models::frozen_weights(m) > 0) {
    // LoRA under bf16: the base is read (or initialized) in fp32 whole, then each unit's
    // projections are copied to bf16 and their fp32 pages given back: the peak holds them twice.
    const int64_t proj_fp32 = 4 * models::frozen_weights(m) - models::frozen_bytes(m);
    plan.lines.push_back(
        {"frozen base at load: fp32 projections (peak)", proj_fp32 / 2});  // beyond their bf16 copy
  }
  if (bf16) {
    // Without bf16 instructions gemm_bf16 widens its operands into two cached fp32 buffers that
    // grow to the largest operands: at most the largest weight and the lm_head chunk's logits.
    if (!ops::bf16_gemm_native() && dev.host)
      plan.lines.push_back({"fp32 operand copies of the converting bf16 path (no AVX512-BF16/AMX)",
                            4 * (largest + loss_scratch)});
  }
  plan.device = t.device;
  if (!dev.host) {  // the device's memory: the same tensors but no host process or probe
    plan.lines.erase(plan.lines.begin());
    if (dev.runtime_memory.second > 0)
      plan.lines.push_back({dev.runtime_memory.first, dev.runtime_memory.second});
    if (dev.probe_memory && cfg.metrics.peak_flops <= 0) {
      const auto [what, bytes] = dev.probe_memory(bf16);
      plan.lines.push_back({what, bytes});
    }
    int64_t total = 0, used = 0;
    plan.capacity = dev.memory && dev.memory(&total, &used) ? total : 0;
    return plan;
  }
  if (cfg.metrics.peak_flops <= 0)
    plan.lines.push_back(bf16 ? MemoryPlan::Line{"GEMM probe at start (2048^2: 3 fp32 + 2 bf16, "
                                                 "freed)",
                                                 16 * 2048 * 2048}
                              : MemoryPlan::Line{"GEMM probe at start (3 x 2048^2 fp32, freed)",
                                                 3 * 4 * 2048 * 2048});
  return plan;
}

void check_fits(const MemoryPlan& plan) {
  const bool host = ops::device(plan.device).host;
  const int64_t have = host ? cpu::total_memory_bytes() : plan.capacity;
  note_planned_bytes(plan.total());  // for the message of an allocation that fails anyway
  if (have <= 0) return;  // a device whose memory cannot be queried: its allocation will say
  const std::string where = host ? "this machine has " : "the " + plan.device + " device has ";
  const MemoryPlan::Line* largest = nullptr;
  for (const auto& l : plan.lines)
    if (!largest || l.bytes > largest->bytes) largest = &l;
  check(plan.total() <= have,
        "the run needs " + gib(plan.total()) + " (titan plan shows each part) but " + where +
            gib(have) +
            (largest ? "; its largest part: " + largest->what + " (" + gib(largest->bytes) + ")"
                     : std::string()) +
            "; lower training.local_batch_size or training.seq_len, or use a smaller model "
            "(model.n_layers, model.dim)");
}

}  // namespace titan::tools
