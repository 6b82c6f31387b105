// Expert parallelism (torchtitan's ExpertParallel): the routed experts of one MoE layer split
// across the P ranks of an EP group, rank r holding experts [r·E/P, (r+1)·E/P), the tokens
// dispatched to the experts' ranks and combined back with all-to-all(v). It wraps any
// grouped-experts op (ops/experts_op.h: the built-in kernels or a plugin's) as another op of
// the same contract, so the model and the kernel stay free of parallelism and a plugin kernel
// keeps working under EP: the kernel only ever sees this rank's experts and the rows sent to
// them.
//
// forward(x[T,D], idx[T,K], w[T,K]) → y[T,D], ExpertsShape::E the layer's experts and the
// weights those of this rank's E/P experts alone, w1[E/P,F,D], w3[E/P,F,D], w2[E/P,D,F] (a model
// built for its ep slice, models/tensor_parallel.h, holds only those):
//   1. each routed row (t, j), j < K, goes to the rank owning expert idx[t,j]: the rows sorted
//      by (destination rank, expert, t, j); the counts per expert exchanged (all-to-all of P·E/P
//      int64), then the rows [x[t] | w[t,j]] (all-to-all(v), D + 1 floats a row);
//   2. the wrapped op runs on the R rows received, as a layer of E/P experts with K = 1 and the
//      rows' routing weights: out[R,D] = w·expert(x') (the local experts' weight slices);
//   3. out goes back to the rows' ranks (all-to-all(v), D floats a row); y[t] = Σ_j out[t,j],
//      j in order.
// backward(dy[T,D]) → dx[T,D], dw[T,K] (written), dw1/dw3/dw2 of this rank's experts (+=):
//   the rows dy[t] go to the experts' ranks (D floats), the wrapped op's backward gives their
//   input and routing-weight gradients (and this rank's experts' weight gradients, summed over
//   every rank's tokens), which come back as [dx' | dw'] (D + 1 floats): dx[t] = Σ_j dx'[t,j],
//   dw[t,j] = dw'[t,j].
// So one layer moves the routed rows four times (two all-to-alls forward, two backward), D
// floats each plus the routing weight and its gradient, and the per-expert counts: the
// theoretical EP volume and 1/D more. Carrying the weight with the row (torchtitan's
// score_before_experts = False applies it after the experts, as here) spares keeping the expert
// outputs for dw: a layer keeps only the rows it received.
//
// Equal to the wrapped op on one process over all ranks' tokens up to the order of float sums:
// the weight gradients sum the same rows in another order, the combine adds the weighted
// outputs in slot order as the built-in kernels do.
//
// State: the rows each layer received live in the op (keyed by the
// layer's `saved` pointer, which the model keeps distinct per layer or recomputes before the
// backward), sized by the step's routing; ExpertsArgs::saved and scratch are not used beyond a
// key. Every rank of the group must call forward and backward in the same order (the model's
// schedule is the same on every rank).
#pragma once
#include <memory>

#include "titan/dist/communicator.h"
#include "titan/ops/experts_op.h"

namespace titan::parallel {

// The exchange buffers of the dispatch: one set serves every layer of a model (the layers run
// one after another), grown to the largest call.
struct DispatchBuffers;
std::shared_ptr<DispatchBuffers> dispatch_buffers();
// Seconds the ops using these buffers spent so far in the exchanges (the all-to-alls, waiting
// for the other ranks included) and in the wrapped experts op.
struct DispatchSeconds {
  double exchange = 0, experts = 0;
};
DispatchSeconds dispatch_seconds(const DispatchBuffers& b);

// The op `local` under expert parallelism over `group` (which must outlive it), for one MoE
// layer or several; its name is local's with "+ep<P>". E % P == 0 is checked by check() and on
// every call. buffers: shared with the other layers' ops (a set of its own when null).
// On a device (local.device other than "cpu") the rows, the buffers and the row moves are the
// device's (ops::Backend copy_rows / sum_rows); the routing is read back to the host, where the
// send order is computed and the counts exchanged over `group` (host memory), and the rows move
// over `rows_group`: the same ranks over the device's memory (dist/device_group.h); null: group.
ops::GroupedExpertsOp expert_parallel(ops::GroupedExpertsOp local, dist::Communicator& group,
                                      std::shared_ptr<DispatchBuffers> buffers = nullptr,
                                      dist::Communicator* rows_group = nullptr);

}  // namespace titan::parallel
