// NCCL groups (one process per GPU, started by mpirun): a Communicator whose collectives run on
// NCCL over device memory of the process's GPU, for the gradients of data parallelism on GPUs.
// Made from a host group of the same ranks (an MPI communicator), which broadcasts rank 0's
// ncclUniqueId and serves barrier(); no CUDA or NCCL type appears here (nccl_group.cpp is built
// with NCCL when CMake finds it beside the CUDA toolkit).
#pragma once
#include <memory>

#include "titan/dist/communicator.h"

namespace titan::dist {

// Whether titan was built with NCCL.
bool nccl_built();

// The NCCL group of `host`'s ranks on the current CUDA device. Buffers passed to it are device
// memory of that GPU. all_reduce (float, double, int64 sums and maxima), reduce_scatter and
// all_gather (equal blocks as one NCCL call, unequal ones as grouped reduces and broadcasts),
// all_to_all (grouped sends and receives), broadcast and split. Each runs on the group's own
// CUDA stream after the work already queued on titan's stream; the …_async forms return at once
// (their wait() blocks until the collective completed; kernels queued meanwhile run beside it),
// the others once it completed. `host` must outlive the group. Throws titan::Error without NCCL or
// when NCCL fails (naming the call and NCCL's message).
std::unique_ptr<Communicator> nccl_group(Communicator& host);

}  // namespace titan::dist
