#include "titan/parallel/fsdp.h"

#include <algorithm>
#include <utility>

#include "titan/core/cpu.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/stochastic_round.h"

namespace titan::parallel {

Fsdp::Fsdp(models::Model& model, const ops::Backend& be, dist::Communicator& group,
           const std::string& policy, bool bf16_gather, dist::Communicator* expert_group)
    : model_(model), be_(be), bf16_(bf16_gather) {
  check(be.device == model.device(),
        "FSDP: the backend (" + be.device + ") is not the model's device (" + model.device() + ")");
  check(!bf16_gather || (be.to_bf16 && be.from_bf16),
        "FSDP: bf16 gathers need the backend's to_bf16 and from_bf16");
  check(policy == "default" || policy == "always" || policy == "never",
        "parallelism.fsdp_reshard_after_forward '" + policy + "' must be default, always or never");
  for (const auto& p : model.params()) tied_ = tied_ || p.alias;
  const auto units = model.store().units();
  const int64_t head = static_cast<int64_t>(units.size()) - 1;
  for (int64_t i = 0; i <= head; ++i) {
    // The unit's pieces: runs of parameters sharded over the same group (the ep-split experts
    // over expert_group, the rest over group), in flat order.
    const int64_t ub = units[static_cast<size_t>(i)].begin, ue = units[static_cast<size_t>(i)].end;
    std::vector<std::pair<int64_t, dist::Communicator*>> cuts;  // (begin, group) of each piece
    for (const auto& p : model.params()) {
      if (p.alias || p.offset < ub || p.offset >= ue || p.numel == 0) continue;
      dist::Communicator* g = expert_group && p.split_over_ep ? expert_group : &group;
      if (cuts.empty() || cuts.back().second != g) cuts.emplace_back(p.offset, g);
    }
    if (cuts.empty()) cuts.emplace_back(ub, &group);
    cuts.front().first = ub;
    first_piece_.push_back(pieces_.size());
    largest_unit_ = std::max(largest_unit_, ue - ub);
    for (size_t c = 0; c < cuts.size(); ++c) {
      Piece u;
      u.unit = i;
      u.group = cuts[c].second;
      u.begin = cuts[c].first;
      u.len = (c + 1 < cuts.size() ? cuts[c + 1].first : ue) - u.begin;
      const int64_t S = u.group->size(), rank = u.group->rank();
      const int64_t block = (u.len + S - 1) / S;
      for (int64_t q = 0; q < S; ++q) {
        const int64_t n = std::clamp<int64_t>(u.len - q * block, 0, block);
        u.counts.push_back(n);
      }
      u.own = u.begin + std::min(u.len, rank * block);
      u.at = shard_len_;
      const int64_t mine = u.counts[static_cast<size_t>(rank)];
      if (mine > 0) own_.push_back({u.own, mine});
      shard_len_ += mine;
      // torchtitan's apply_fsdp: the layers (and an untied embedding) reshard after the forward
      // unless "never"; the head group ([norm, lm_head], with the embedding when tied) only for
      // "always". The head's forward and backward are one use; an embedding's backward reads no
      // weights.
      const bool head_group = i == head || (i == 0 && tied_);
      u.reshard_after_forward = policy == "always" || (policy == "default" && !head_group);
      u.weights_in_backward = i != 0 && i != head;
      pieces_.push_back(std::move(u));
    }
  }
  first_piece_.push_back(pieces_.size());
  master_.resize(shard_len_, be.memory());
  grad_shard_.resize(shard_len_, be.memory());
  int64_t scratch = 0;  // one unit's reduce-scattered blocks, every piece's
  for (size_t i = 0; i + 1 < first_piece_.size(); ++i) {
    int64_t n = 0;
    for (size_t k = first_piece_[i]; k < first_piece_[i + 1]; ++k)
      n += (pieces_[k].len + pieces_[k].group->size() - 1) / pieces_[k].group->size();
    scratch = std::max(scratch, n);
  }
  scratch_.resize(scratch, be.memory());
  if (model.store().bf16_masters()) {
    check(be.memory().host(), "FSDP: bf16 master weights are kept on the CPU only");
    for (const Piece& u : pieces_)
      for (const auto& r : model.store().copy_only()) {
        const int64_t b = std::max(u.own, r.begin), e = std::min(u.own + mine(u), r.begin + r.len);
        if (b < e) bf16_runs_.push_back({u.at + (b - u.own), b, e - b});
      }
    master16_.resize(shard_len_);  // pages only where written (the runs)
  }
}

template <typename Fn>
void Fsdp::for_bf16_runs(int64_t at, int64_t len, Fn&& fn) const {
  for (const Bf16Run& r : bf16_runs_) {
    const int64_t b = std::max(at, r.at), e = std::min(at + len, r.at + r.len);
    if (b < e) fn(b, r.flat + (b - r.at), e - b);
  }
}

void Fsdp::release_masters() {
  if (released_ || bf16_runs_.empty()) return;
  for (const Bf16Run& r : bf16_runs_) {
    be_.to_bf16(master_.data() + r.at, r.len, master16_.data() + r.at);
    zero_and_release(master_.data() + r.at, r.len);
  }
  released_ = true;
}

void Fsdp::widen_masters() {
  if (!released_) return;
  for (const Bf16Run& r : bf16_runs_)
    to_f32(DType::BF16, master16_.data() + r.at, r.len, master_.data() + r.at);
  released_ = false;
}

void Fsdp::update_begin(int64_t at, int64_t len) {
  if (!released_) return;
  for_bf16_runs(at, len, [&](int64_t a, int64_t, int64_t n) {
    to_f32(DType::BF16, master16_.data() + a, n, master_.data() + a);
  });
}

void Fsdp::update_end(int64_t at, int64_t len, uint64_t key) {
  if (!released_) return;
  for_bf16_runs(at, len, [&](int64_t a, int64_t flat, int64_t n) {
    round_bf16_stochastic(master_.data() + a, n, key, flat, master16_.data() + a);
    zero_and_release(master_.data() + a, n);
  });
}

void Fsdp::copy(float* dst, const float* src, int64_t n) const {
  if (n > 0) be_.copy(dst, src, sizeof(float) * static_cast<size_t>(n));
}

void Fsdp::wait(dist::Request& r) {
  const double t0 = cpu::now_seconds();
  r.wait();
  exposed_seconds_ += cpu::now_seconds() - t0;
  comm_seconds_ += r.seconds();
}

int64_t Fsdp::mine(const Piece& u) const { return u.counts[static_cast<size_t>(u.group->rank())]; }

void Fsdp::start_gather(Piece& u) {
  model_.store().hold(Flat::params, u.begin, u.len);
  float* P = model_.store().unit_param_data(u.unit);
  const int64_t own = mine(u);
  const double t0 = cpu::now_seconds();  // (the whole collective, where MPI runs it blocking)
  if (bf16_ && !exact_) {
    size_t k = 0;
    while (k < stages_.size() && stage_busy_[k]) ++k;
    if (k == stages_.size()) {
      stages_.emplace_back().resize(largest_unit_, be_.memory());
      stage_busy_.push_back(false);
    }
    stage_busy_[k] = true;
    u.stage = static_cast<int>(k);
    uint16_t* s = stages_[k].data();
    if (own > 0) be_.to_bf16(master_.data() + u.at, own, s + (u.own - u.begin));
    if (released_)  // the bf16 masters as they are (their fp32 pages read as zeros above)
      for_bf16_runs(u.at, own, [&](int64_t a, int64_t flat, int64_t n) {
        std::copy_n(master16_.data() + a, n, s + (flat - u.begin));
      });
    u.gathering = u.group->all_gather_async(s, u.counts);
  } else {
    copy(P + u.own, master_.data() + u.at, own);
    if (released_)  // exact: the bf16 masters widened
      for_bf16_runs(u.at, own, [&](int64_t a, int64_t flat, int64_t n) {
        to_f32(DType::BF16, master16_.data() + a, n, P + flat);
      });
    u.gathering = u.group->all_gather_async(P + u.begin, u.counts);
  }
  exposed_seconds_ += cpu::now_seconds() - t0;
  u.gathered = true;
}

void Fsdp::finish_gather(Piece& u) {
  if (!u.gathering) return;
  wait(*u.gathering);
  u.gathering.reset();
  // The unit's values changed again (a host copy read while the gather ran is read again).
  float* P = model_.store().unit_param_data(u.unit);
  if (u.stage < 0) return;
  const auto k = static_cast<size_t>(u.stage);
  if (u.len > 0) be_.from_bf16(stages_[k].data(), u.len, P + u.begin);
  stage_busy_[k] = false;
  u.stage = -1;
}

void Fsdp::reshard(Piece& u) {
  finish_gather(u);  // a prefetched unit nobody used (the buffer is the collective's until then)
  model_.store().give_back(Flat::params, u.begin, u.len);
  u.gathered = false;
}

void Fsdp::take_piece(Piece& u) {
  // From the host copy the weights were loaded or initialized into (off the CPU that copy's range
  // is given back too, so nothing of it is sent).
  copy(master_.data() + u.at, std::as_const(model_).store().param_data() + u.own, mine(u));
  reshard(u);
  model_.store().give_back(Flat::grads, u.begin, u.len);
}

void Fsdp::take_unit(int64_t i) {
  for (size_t k = first_piece_[static_cast<size_t>(i)];
       k < first_piece_[static_cast<size_t>(i) + 1]; ++k)
    take_piece(pieces_[k]);
}

void Fsdp::take_params_from_model() {
  for (auto& u : pieces_) take_piece(u);
}

void Fsdp::init_unit_by_unit(uint64_t seed) {
  for (size_t i = 0; i + 1 < first_piece_.size(); ++i) {
    model_.init_weights(seed, 0.02f, static_cast<int64_t>(i));
    take_unit(static_cast<int64_t>(i));
  }
}

void Fsdp::reshard_all() {
  for (auto& u : pieces_)
    if (u.gathered) reshard(u);
}

void Fsdp::gather_all() {
  reshard_all();  // what a pass left gathered holds bf16 values under bf16 gathers
  begin_pass(false);
  exact_ = true;
  for (int64_t i = 0; i < units(); ++i) {
    acquire(i, false);
    // Off the CPU the host copy is what is read: each unit kept there, its device memory given
    // back, so the device never holds the whole weights.
    for (Piece* u : unit(i)) model_.store().give_back_device(u->begin, u->len);
  }
  exact_ = false;
}

void Fsdp::for_each_unit_whole(const std::function<void(int64_t)>& fn) {
  reshard_all();
  begin_pass(false);
  exact_ = true;
  for (int64_t i = 0; i < units(); ++i) {
    acquire(i, false);
    fn(i);
    for (Piece* u : unit(i)) reshard(*u);
  }
  exact_ = false;
}

std::vector<Fsdp::Piece*> Fsdp::unit(int64_t i) {
  std::vector<Piece*> out;
  for (size_t k = first_piece_[static_cast<size_t>(i)];
       k < first_piece_[static_cast<size_t>(i) + 1]; ++k)
    out.push_back(&pieces_[k]);
  return out;
}

const Fsdp::Piece& Fsdp::first(int64_t i) const {
  return pieces_[first_piece_[static_cast<size_t>(i)]];
}

void Fsdp::begin_pass(bool backward_follows) {
  finish_grads();  // a tied lm_head's next gradient lands in unit 0's, which may be reducing
  backward_follows_ = backward_follows;
  head_done_ = false;
}

void Fsdp::prefetch(int64_t i) {
  if (i < 0 || i >= units()) return;
  for (Piece* u : unit(i))
    if (!u->gathered) start_gather(*u);
}

void Fsdp::acquire(int64_t i, bool backward) {
  for (Piece* u : unit(i))
    if (!u->gathered) start_gather(*u);
  for (Piece* u : unit(i)) finish_gather(*u);
  // Memory for the gradients this pass computes: a layer's in its backward; the head's in its
  // forward (fused with its backward) and the embedding's from the forward on (a tied lm_head's
  // gradient lands there at the head; an untied embedding's backward acquires nothing).
  if (backward || (backward_follows_ && !first(i).weights_in_backward))
    for (Piece* u : unit(i)) model_.store().hold(Flat::grads, u->begin, u->len);
  // The unit this pass reads next, gathered while this one computes: in the forward the next
  // unit until the head; at the head (and a tied embedding read with it) the last layer, when
  // a backward follows; in the backward the layer below (the embedding's backward reads no
  // weights).
  const int64_t head = units() - 1;
  if (backward) {
    if (i - 1 >= 0 && first(i - 1).weights_in_backward) prefetch(i - 1);
  } else if (i == head || head_done_) {
    head_done_ = true;
    if (backward_follows_ && first(head - 1).weights_in_backward) prefetch(head - 1);
  } else {
    prefetch(i + 1);
  }
}

bool Fsdp::release(int64_t i, bool backward) {
  const Piece& f = first(i);
  if (!f.gathered || !(backward || f.reshard_after_forward)) return false;
  for (Piece* u : unit(i)) reshard(*u);
  return true;
}

void Fsdp::finish_grads() {
  for (auto& [k, req] : reducing_) {
    wait(*req);
    const Piece& u = pieces_[k.piece];
    if (mine(u) > 0)
      be_.add_inplace(grad_shard_.data() + u.at, scratch_.data() + k.scratch, mine(u));
    model_.store().give_back(Flat::grads, u.begin, u.len);
    if (on_reduced_) on_reduced_(u.at, mine(u));
  }
  reducing_.clear();
}

void Fsdp::grads_ready(int64_t i) {
  finish_grads();  // the previous unit's, overlapped with this unit's backward
  const double t0 = cpu::now_seconds();
  int64_t at = 0;
  for (size_t k = first_piece_[static_cast<size_t>(i)];
       k < first_piece_[static_cast<size_t>(i) + 1]; ++k) {
    const Piece& u = pieces_[k];
    reducing_.emplace_back(Reducing{k, at},
                           u.group->reduce_scatter_async(model_.store().grads() + u.begin,
                                                         scratch_.data() + at, u.counts));
    at += (u.len + u.group->size() - 1) / u.group->size();
  }
  exposed_seconds_ += cpu::now_seconds() - t0;
}

double Fsdp::theory_bytes_per_step(int64_t microbatches) const {
  // Ring volumes: an all-gather or reduce-scatter of B bytes over S ranks sends (S−1)/S·B per
  // rank. Per microbatch each unit is gathered for the forward, again for the backward when it
  // was resharded in between and its backward reads weights (a tied embedding: again for the
  // head), and its gradient reduce-scattered once; each piece over its own group.
  double bytes = 0;
  for (const Piece& u : pieces_) {
    const double S = static_cast<double>(u.group->size());
    int gathers = 1 + (u.reshard_after_forward && u.weights_in_backward);
    if (u.unit == 0 && tied_ && u.reshard_after_forward) ++gathers;
    bytes += (S - 1) / S * static_cast<double>(u.len) * ((bf16_ ? 2.0 : 4.0) * gathers + 4.0);
  }
  return bytes * static_cast<double>(microbatches);
}

}  // namespace titan::parallel
