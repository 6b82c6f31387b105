// FSDP (torchtitan's FSDP2, ZeRO-3) over one replica's shard group: the model's parameter units
// (models/model.h: the embedding, each decoder layer, the head) sharded across the S ranks of
// the fsdp mesh, installed as the model's ParamHooks, so the model stays free of parallelism.
//
// Rank r owns block r of every unit's flat range (blocks of ceil(len / S) elements, the last
// shorter or empty): the fp32 master parameters, the reduced gradient and (the trainer's) AdamW
// state of those elements, in shard buffers that concatenate its blocks unit by unit.
//   acquire(u)     all-gathers unit u into the model's flat parameter buffer before use (in
//                  fp32; under bf16 mixed precision in bf16, FSDP2's param_dtype: each rank's
//                  block rounded to bf16, gathered, widened, so every parameter the model reads,
//                  norms included, is the bf16 value, as torchtitan computes),
//                  then starts the gather of the unit the pass uses next (FSDP2's forward and
//                  backward prefetch: u+1 in the forward, the last layer at the head when a
//                  backward follows, u−1 in the backward), which runs in the background
//                  (dist::Communicator's lane; an NCCL group's own stream) while u computes;
//   release(u)     reshards it (zeros, memory given back: ParamStore::give_back) after the backward
//                  always, after the forward per fsdp_reshard_after_forward: "default" and
//                  "always" for the decoder layers and an untied embedding; the head ([norm,
//                  lm_head], with the embedding when tied) only for "always" (torchtitan's
//                  apply_fsdp);
//   grads_ready(u) starts the reduce-scatter of unit u's gradient of the microbatch (fp32 sums,
//                  gradient divide factor 1) in the background, after finishing the previous
//                  unit's: its block added (+=) to this rank's, its full gradient released. So
//                  one reduce-scatter overlaps the next unit's backward; finish_grads() (the
//                  trainer, before it reads the gradient shard) and the next pass finish the last.
// Between steps nothing is gathered: after the optimizer updates the masters every unit is
// resharded. At most two units are gathered at once (the one computing and the prefetched one)
// and two units' full gradients exist (the one computing and the one being reduced).
//
// bf16 master weights (training.dtype bfloat16: the model's ParamStore::bf16_masters): this rank's
// blocks of the copy-only ranges (ParamStore::copy_only, the projections) keep bf16 masters only,
// sent as they are by the bf16 gathers; an update widens one block to fp32 and rounds it back
// stochastically, keyed by each element's flat offset (as ParamStore::update_end); exact gathers
// and a checkpoint's save read them widened. The CPU only.
//
// Off the CPU (the model's device(): a GPU) the masters, the gradient shard and the staging
// buffers live in the device's memory and every copy, bf16 rounding and widening and gradient sum
// runs through its backend (`be`); `group` (and `expert_group`) must then move device memory (an
// NCCL group). There the model, built sharded (models::BuildOptions::sharded), keeps its flat
// weight, gradient and compute-copy buffers as reserved address ranges: each piece is held
// (ParamStore::hold: memory committed behind it) before it is gathered into or its gradients are
// computed, and given back when resharded, as host pages are on the CPU; on a device without
// reserve (core/device.h) the flat buffers stay whole and resharding only zeroes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/core/buffer.h"
#include "titan/dist/communicator.h"
#include "titan/models/model.h"
#include "titan/ops/backend.h"

namespace titan::parallel {

class Fsdp final : public models::ParamHooks {
 public:
  // reshard_after_forward: the config's "default" | "always" | "never"; bf16_gather: gathers
  // move bf16 (mixed_precision_param bfloat16).
  // expert_group: torchtitan's efsdp mesh under expert parallelism, over which the parameters
  // split over the ep ranks (ParamInfo::split_over_ep: each rank's own experts) are sharded
  // instead, as one piece of their unit gathered and reduced beside the rest; null: everything
  // over group.
  // be: the backend of the model's device and dtype (bf16_gather needs its to_bf16/from_bf16).
  Fsdp(models::Model& model, const ops::Backend& be, dist::Communicator& group,
       const std::string& reshard_after_forward, bool bf16_gather = false,
       dist::Communicator* expert_group = nullptr);

  // This rank's segments, in the order its shard buffers concatenate them.
  const ckpt::Segments& own_segments() const { return own_; }
  int64_t shard_len() const { return shard_len_; }
  // In the model's memory (a device's off the CPU).
  float* master() { return master_.data(); }
  float* grad_shard() { return grad_shard_.data(); }
  // The largest unit: what one gathered unit adds to a rank's memory.
  int64_t largest_unit() const { return largest_unit_; }

  // After the model's weights were loaded whole: keep this rank's blocks as its masters, reshard
  // everything (gradients too).
  void take_params_from_model();
  // A fresh model: each unit initialized (Model::init_weights, the values a whole init gives),
  // its block kept, resharded, one unit at a time, so the whole weights never exist here.
  void init_unit_by_unit(uint64_t seed);
  // Unit u alone, just loaded whole into the model (a checkpoint read unit by unit): keep this
  // rank's block, give the rest back.
  void take_unit(int64_t u);
  void begin_step() { grad_shard_.zero(); }
  // The last gradient reduce-scatter finished: grad_shard() complete.
  void finish_grads();
  // Called with this rank's block of a unit (at, len in the shard buffers) as soon as its
  // reduce-scatter has completed and been added to grad_shard() (optimizer.early_step_in_backward
  // updates it there and then; one microbatch per step).
  void set_on_reduced(std::function<void(int64_t at, int64_t len)> fn) {
    on_reduced_ = std::move(fn);
  }
  // The masters changed (optimizer step): every unit resharded.
  void reshard_all();
  // Every unit whole in the model's param_data(), the fp32 masters exactly (an export, the error
  // path's weight check; off the CPU in the host copy, the device holding a unit at a time);
  // reshard_all after, before any pass.
  void gather_all();
  // fn(u) for each unit u in turn while it alone is whole (the fp32 masters exactly; the next
  // one on its way): what a parallel export reads, one unit's memory at a time.
  void for_each_unit_whole(const std::function<void(int64_t unit)>& fn);

  // bf16 master weights: release_masters() rounds this rank's copy-only blocks to bf16 (to
  // nearest: the weights as loaded or initialized) and gives their fp32 pages back;
  // widen_masters() makes master() whole fp32 again (exactly; a checkpoint's save) until the
  // next release_masters(). Nothing unless the model's store has bf16_masters.
  void release_masters();
  void widen_masters();
  bool masters_released() const { return released_; }
  // One update of master()[at, at+len) (whole blocks of own_segments()): update_begin widens its
  // bf16 masters into master(), update_end rounds them back with key and gives the fp32 pages
  // back. Nothing unless released.
  void update_begin(int64_t at, int64_t len);
  void update_end(int64_t at, int64_t len, uint64_t key);

  // Since construction: seconds this object's collectives took from start to completion
  // (comm_seconds), and the part of them the model waited for, not hidden behind compute
  // (exposed_seconds); the bytes one step of `microbatches` microbatches moves per rank in
  // theory under this policy (ring model).
  double comm_seconds() const { return comm_seconds_; }
  double exposed_seconds() const { return exposed_seconds_; }
  double theory_bytes_per_step(int64_t microbatches) const;

  void begin_pass(bool backward_follows) override;
  void acquire(int64_t u, bool backward) override;
  bool release(int64_t u, bool backward) override;
  void grads_ready(int64_t u) override;

 private:
  // A run of one unit's flat range sharded over one group (a unit is one piece, or two under
  // expert parallelism: its experts over the efsdp group).
  struct Piece {
    int64_t unit = 0;
    dist::Communicator* group = nullptr;
    int64_t begin = 0, len = 0;
    std::vector<int64_t> counts;  // every rank's block length
    int64_t own = 0;              // this rank's block: flat offset begin + rank · block
    int64_t at = 0;               // where it sits in the shard buffers
    bool reshard_after_forward = true;
    bool weights_in_backward = true;  // the head's backward is fused with its forward
    bool gathered = false;            // whole in the model, or on its way (gathering)
    std::unique_ptr<dist::Request> gathering;
    int stage = -1;  // the bf16 staging buffer it is gathered in
  };
  struct Reducing {
    size_t piece = 0;
    int64_t scratch = 0;  // where its block lands in scratch_
  };
  // A run of this rank's shard whose masters are bf16: at in the shard buffers, flat in the model.
  struct Bf16Run {
    int64_t at = 0, flat = 0, len = 0;
  };
  // fn(at, flat, len) for each part of a bf16 run inside master()[at, at+len).
  template <typename Fn>
  void for_bf16_runs(int64_t at, int64_t len, Fn&& fn) const;
  int64_t units() const { return static_cast<int64_t>(first_piece_.size()) - 1; }
  std::vector<Piece*> unit(int64_t i);
  const Piece& first(int64_t i) const;
  int64_t mine(const Piece& u) const;
  void reshard(Piece& u);
  void take_piece(Piece& u);
  void start_gather(Piece& u);
  void finish_gather(Piece& u);
  void prefetch(int64_t u);
  void wait(dist::Request& r);  // counts the seconds it took and the part waited for
  // n floats copied in the model's memory (either side may be the host).
  void copy(float* dst, const float* src, int64_t n) const;
  using Flat = models::ParamStore::Flat;

  models::Model& model_;
  const ops::Backend& be_;
  std::vector<Piece> pieces_;
  std::vector<size_t> first_piece_;  // unit i: pieces [first_piece_[i], first_piece_[i+1])
  ckpt::Segments own_;
  bool tied_ = false;  // lm_head is the embedding's storage (unit 0 is in the head's group)
  int64_t shard_len_ = 0, largest_unit_ = 0;
  Buffer<float> master_, grad_shard_, scratch_;  // scratch_: one unit's reduce-scattered blocks
  std::vector<std::pair<Reducing, std::unique_ptr<dist::Request>>> reducing_;  // in flight
  std::function<void(int64_t at, int64_t len)> on_reduced_;
  bool backward_follows_ = false, head_done_ = false;  // of the pass under way
  bool bf16_ = false, exact_ = false;                  // exact_: gather_all's fp32 gathers
  std::vector<Buffer<uint16_t>> stages_;               // bf16 gathers in flight, one each
  std::vector<bool> stage_busy_;
  std::vector<Bf16Run> bf16_runs_;
  Buffer<uint16_t> master16_;  // the bf16 masters, at the shard offsets of bf16_runs_
  bool released_ = false;
  double comm_seconds_ = 0, exposed_seconds_ = 0;
};

}  // namespace titan::parallel
