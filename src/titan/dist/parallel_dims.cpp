#include "titan/dist/parallel_dims.h"

#include "titan/core/error.h"

namespace titan::dist {

ParallelDims ParallelDims::from_config(const config::JobConfig& cfg, int64_t world_size) {
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
  const struct {
    const char* name;
    int64_t v;
    const char* what;
  } later[] = {{"tensor_parallel_degree", d.tp, "tensor parallelism"},
               {"expert_parallel_degree", d.ep, "expert parallelism"},
               {"context_parallel_degree", d.cp, "context parallelism"},
               {"pipeline_parallel_degree", d.pp, "pipeline parallelism"}};
  for (const auto& g : later)
    check(g.v == 1, std::string("parallelism.") + g.name + " " + std::to_string(g.v) + ": " +
                        g.what +
                        " is not implemented yet; use data parallelism "
                        "(data_parallel_shard_degree / data_parallel_replicate_degree)");
  return d;
}

std::string ParallelDims::describe() const {
  if (batch() == 1) return "single process";
  if (dp_shard == 1) return "DDP " + std::to_string(dp_replicate);
  if (dp_replicate == 1) return "FSDP " + std::to_string(dp_shard);
  return "HSDP " + std::to_string(dp_replicate) + "x" + std::to_string(dp_shard);
}

Meshes make_meshes(const ParallelDims& d, Communicator& world) {
  Meshes m;
  const int r = world.rank();
  const int rep = static_cast<int>(r / d.dp_shard), shard = static_cast<int>(r % d.dp_shard);
  m.batch = world.split(0, r);
  m.fsdp = world.split(rep, shard);
  m.replicate = world.split(shard, rep);
  m.batch_rank = r;
  m.fsdp_rank = shard;
  m.replicate_rank = rep;
  return m;
}

}  // namespace titan::dist
