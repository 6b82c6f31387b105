#include "titan/dist/parallel_dims.h"

#include <algorithm>

#include "titan/core/error.h"

namespace titan::dist {

ParallelDims ParallelDims::layout(const config::JobConfig& cfg, int64_t world_size) {
  const auto& p = cfg.parallelism;
  ParallelDims d;
  d.world = world_size;
  d.dp_replicate = p.data_parallel_replicate_degree;
  d.dp_shard = p.data_parallel_shard_degree;
  d.tp = p.tensor_parallel_degree;
  d.ep = p.expert_parallel_degree;
  d.cp = p.context_parallel_degree;
  d.pp = p.pipeline_parallel_degree;
  const struct {
    const char* name;
    int64_t v;
  } degrees[] = {{"data_parallel_replicate_degree", d.dp_replicate},
                 {"tensor_parallel_degree", d.tp},
                 {"expert_parallel_degree", d.ep},
                 {"context_parallel_degree", d.cp},
                 {"pipeline_parallel_degree", d.pp}};
  for (const auto& g : degrees)
    check(g.v >= 1,
          std::string("parallelism.") + g.name + " must be >= 1, got " + std::to_string(g.v));
  check(d.dp_shard == -1 || d.dp_shard >= 1,
        "parallelism.data_parallel_shard_degree must be -1 or >= 1, got " +
            std::to_string(d.dp_shard));
  if (d.dp_shard == -1) d.dp_shard = world_size / (d.dp_replicate * d.cp * d.tp * d.pp);
  check(d.dp_shard >= 1 && d.dp_replicate * d.dp_shard * d.cp * d.tp * d.pp == world_size,
        "Invalid parallel dims: dp_replicate(" + std::to_string(d.dp_replicate) + ") * dp_shard(" +
            std::to_string(d.dp_shard) + ") * cp(" + std::to_string(d.cp) + ") * tp(" +
            std::to_string(d.tp) + ") * pp(" + std::to_string(d.pp) + ") != WORLD_SIZE(" +
            std::to_string(world_size) +
            ") (set the parallelism.* degrees so that their product is the number of ranks "
            "mpirun starts)");
  check((d.dp_shard * d.cp * d.tp) % d.ep == 0,
        "Invalid parallel dims: dp_shard(" + std::to_string(d.dp_shard) + ") * cp(" +
            std::to_string(d.cp) + ") * tp(" + std::to_string(d.tp) + ") must be divisible by ep(" +
            std::to_string(d.ep) + ")");
  const std::string& r = p.fsdp_reshard_after_forward;
  check(r == "default" || r == "always" || r == "never",
        "parallelism.fsdp_reshard_after_forward '" + r + "' is not one of default, always, never");
  d.sp = d.tp > 1 && p.enable_sequence_parallel;
  d.loss_parallel = d.tp > 1 && !p.disable_loss_parallel;
  return d;
}

ParallelDims ParallelDims::for_plan(const config::JobConfig& cfg) {
  const auto& p = cfg.parallelism;
  const int64_t shard = std::max<int64_t>(1, p.data_parallel_shard_degree);
  return layout(cfg, p.data_parallel_replicate_degree * shard * p.context_parallel_degree *
                         p.tensor_parallel_degree * p.pipeline_parallel_degree);
}

ParallelDims ParallelDims::from_config(const config::JobConfig& cfg, int64_t world_size) {
  const ParallelDims d = layout(cfg, world_size);
  check(d.pp == 1, "parallelism.pipeline_parallel_degree " + std::to_string(d.pp) +
                      ": pipeline parallelism is not implemented yet for training; use data "
                      "parallelism (data_parallel_shard_degree / data_parallel_replicate_degree)");
  if (d.cp > 1) {  // torchtitan: the sequence splits into 2·cp chunks (×tp under SP)
    const int64_t div = 2 * d.cp * (d.sp ? d.tp : 1);
    const int64_t seq = cfg.training.seq_len;
    check(seq % div == 0,
          "training.seq_len " + std::to_string(seq) + " must be divisible by " +
              (d.sp ? "tp * 2 * cp = " : "2 * cp = ") + std::to_string(div) +
              " (context parallelism's head-tail chunks" + (d.sp ? ", split again by sequence parallelism" : "") +
              "); change training.seq_len or parallelism.context_parallel_degree");
    const std::string& lb = cfg.parallelism.context_parallel_load_balancer;
    check(lb == "headtail",
          "parallelism.context_parallel_load_balancer '" + lb +
              "': titan splits the sequence head-tail only (the default, 'headtail')");
    const std::string& rot = cfg.parallelism.context_parallel_rotate_method;
    check(rot == "allgather",
          "parallelism.context_parallel_rotate_method '" + rot +
              "': titan gathers the keys and values ('allgather', the default); the ring "
              "rotation ('alltoall') is not implemented yet");
  }
  // EP borrows whole tp groups (expert_tensor_parallel_degree 1: the experts are not split
  // over tp).
  check(d.tp == 1 || d.ep == 1 || d.ep % d.tp == 0,
        "parallelism.expert_parallel_degree " + std::to_string(d.ep) +
            " must be a multiple of tensor_parallel_degree " + std::to_string(d.tp) +
            " (expert parallelism borrows whole tensor-parallel groups; "
            "expert_tensor_parallel_degree is 1)");
  return d;
}

std::string ParallelDims::describe() const {
  std::string s;
  if (batch() > 1) {
    if (dp_shard == 1)
      s = "DDP " + std::to_string(dp_replicate);
    else if (dp_replicate == 1)
      s = "FSDP " + std::to_string(dp_shard);
    else
      s = "HSDP " + std::to_string(dp_replicate) + "x" + std::to_string(dp_shard);
  }
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : " x ") + part; };
  if (cp > 1) add("CP " + std::to_string(cp));
  if (tp > 1) add("TP " + std::to_string(tp) + (sp ? " (SP)" : ""));
  if (ep > 1) add("EP " + std::to_string(ep));
  return s.empty() ? "single process" : s;
}

Meshes make_meshes(const ParallelDims& d, Communicator& world) {
  Meshes m;
  // torchtitan's mesh order [dp_replicate, dp_shard, cp, tp]: tp innermost (consecutive ranks).
  const int tp = static_cast<int>(d.tp), cp = static_cast<int>(d.cp), r = world.rank();
  const int t = r % tp, q = r / tp, c = q % cp, data = q / cp;
  const int rep = static_cast<int>(data / d.dp_shard), shard = static_cast<int>(data % d.dp_shard);
  const int sc = shard * cp + c;  // this rank among the replica's dp_shard·cp (FSDP's ranks)
  m.batch = world.split(t, q);
  m.fsdp = world.split(rep * tp + t, sc);
  m.replicate = world.split(sc * tp + t, rep);
  m.tp = world.split(q, t);
  m.cp = world.split(data * tp + t, c);
  // EP borrows consecutive ranks of the replica's [dp_shard, cp, tp] grid (torchtitan's
  // dp_shard_in_ep × cp × tp); efsdp joins the ranks of the grid at the same place of their ep
  // group.
  const int ep = static_cast<int>(d.ep), grid = static_cast<int>(d.dp_shard) * cp * tp;
  const int i = sc * tp + t;  // this rank in its replica's grid
  m.ep = world.split(rep * (grid / ep) + i / ep, i % ep);
  m.efsdp = world.split(rep * ep + i % ep, i / ep);
  m.batch_rank = data;
  m.fsdp_rank = sc;
  m.replicate_rank = rep;
  m.tp_rank = t;
  m.cp_rank = c;
  return m;
}

}  // namespace titan::dist
