#include "titan/train/fsdp.h"

#include <algorithm>
#include <utility>

#include "titan/core/cpu.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"

namespace titan::train {

Fsdp::Fsdp(models::Model& model, dist::Communicator& group, const std::string& policy,
           bool bf16_gather)
    : model_(model), group_(group), bf16_(bf16_gather) {
  check(policy == "default" || policy == "always" || policy == "never",
        "parallelism.fsdp_reshard_after_forward '" + policy + "' must be default, always or never");
  for (const auto& p : model.params()) tied_ = tied_ || p.alias;
  const auto units = model.param_units();
  const int64_t S = group.size(), rank = group.rank(),
                head = static_cast<int64_t>(units.size()) - 1;
  shards_.assign(static_cast<size_t>(S), {});
  for (int64_t i = 0; i <= head; ++i) {
    Unit u;
    u.begin = units[static_cast<size_t>(i)].begin;
    u.len = units[static_cast<size_t>(i)].end - u.begin;
    const int64_t block = (u.len + S - 1) / S;
    for (int64_t q = 0; q < S; ++q) {
      const int64_t c = std::clamp<int64_t>(u.len - q * block, 0, block);
      u.counts.push_back(c);
      if (c > 0) shards_[static_cast<size_t>(q)].push_back({u.begin + q * block, c});
    }
    u.own = u.begin + std::min(u.len, rank * block);
    u.at = shard_len_;
    shard_len_ += u.counts[static_cast<size_t>(rank)];
    largest_unit_ = std::max(largest_unit_, u.len);
    // torchtitan's apply_fsdp: the layers (and an untied embedding) reshard after the forward
    // unless "never"; the head group ([norm, lm_head], with the embedding when tied) only for
    // "always". The head's forward and backward are one use; an embedding's backward reads no
    // weights.
    const bool head_group = i == head || (i == 0 && tied_);
    u.reshard_after_forward = policy == "always" || (policy == "default" && !head_group);
    u.weights_in_backward = i != 0 && i != head;
    units_.push_back(std::move(u));
  }
  master_.resize(shard_len_);
  grad_shard_.resize(shard_len_);
  scratch_.resize((largest_unit_ + S - 1) / S);
}

void Fsdp::wait(dist::Request& r) {
  const double t0 = cpu::now_seconds();
  r.wait();
  exposed_seconds_ += cpu::now_seconds() - t0;
  comm_seconds_ += r.seconds();
}

void Fsdp::start_gather(Unit& u) {
  float* P = model_.unit_param_data(&u - units_.data());
  const int64_t own = u.counts[static_cast<size_t>(group_.rank())];
  const double t0 = cpu::now_seconds();  // (the whole collective, where MPI runs it blocking)
  if (bf16_ && !exact_) {
    size_t k = 0;
    while (k < stages_.size() && stage_busy_[k]) ++k;
    if (k == stages_.size()) {
      stages_.emplace_back(largest_unit_);
      stage_busy_.push_back(false);
    }
    stage_busy_[k] = true;
    u.stage = static_cast<int>(k);
    uint16_t* s = stages_[k].data();
    f32_to(DType::BF16, master_.data() + u.at, own, s + (u.own - u.begin));
    u.gathering = group_.all_gather_async(s, u.counts);
  } else {
    std::copy_n(master_.data() + u.at, own, P + u.own);
    u.gathering = group_.all_gather_async(P + u.begin, u.counts);
  }
  exposed_seconds_ += cpu::now_seconds() - t0;
  u.gathered = true;
}

void Fsdp::finish_gather(Unit& u) {
  if (!u.gathering) return;
  wait(*u.gathering);
  u.gathering.reset();
  if (u.stage < 0) return;
  const auto k = static_cast<size_t>(u.stage);
  to_f32(DType::BF16, stages_[k].data(), u.len,
         model_.unit_param_data(&u - units_.data()) + u.begin);
  stage_busy_[k] = false;
  u.stage = -1;
}

void Fsdp::reshard(Unit& u) {
  finish_gather(u);  // a prefetched unit nobody used (the buffer is the collective's until then)
  zero_and_release(model_.unit_param_data(&u - units_.data()) + u.begin, u.len);
  u.gathered = false;
}

void Fsdp::take_unit(Unit& u) {
  const float* P = model_.param_data();
  std::copy_n(P + u.own, u.counts[static_cast<size_t>(group_.rank())], master_.data() + u.at);
  reshard(u);
  zero_and_release(model_.grad_data() + u.begin, u.len);
}

void Fsdp::gather_whole(const float* shard, float* whole) {
  for (const auto& u : units_) {
    const auto me = static_cast<size_t>(group_.rank());
    std::copy_n(shard + u.at, u.counts[me], whole + u.own);
    group_.all_gather(whole + u.begin, u.counts);
  }
}

void Fsdp::take_whole(const float* whole, float* shard) const {
  for (const auto& u : units_)
    std::copy_n(whole + u.own, u.counts[static_cast<size_t>(group_.rank())], shard + u.at);
}

void Fsdp::take_params_from_model() {
  for (auto& u : units_) take_unit(u);
}

void Fsdp::init_unit_by_unit(uint64_t seed) {
  for (size_t i = 0; i < units_.size(); ++i) {
    model_.init_weights(seed, 0.02f, static_cast<int64_t>(i));
    take_unit(units_[i]);
  }
}

void Fsdp::reshard_all() {
  for (auto& u : units_)
    if (u.gathered) reshard(u);
}

void Fsdp::gather_all() {
  reshard_all();  // what a pass left gathered holds bf16 values under bf16 gathers
  begin_pass(false);
  exact_ = true;
  for (size_t i = 0; i < units_.size(); ++i) acquire(static_cast<int64_t>(i), false);
  exact_ = false;
}

void Fsdp::for_each_unit_whole(const std::function<void(int64_t)>& fn) {
  reshard_all();
  begin_pass(false);
  exact_ = true;
  for (size_t i = 0; i < units_.size(); ++i) {
    acquire(static_cast<int64_t>(i), false);
    fn(static_cast<int64_t>(i));
    reshard(units_[i]);
  }
  exact_ = false;
}

void Fsdp::begin_pass(bool backward_follows) {
  finish_grads();  // a tied lm_head's next gradient lands in unit 0's, which may be reducing
  backward_follows_ = backward_follows;
  head_done_ = false;
}

void Fsdp::prefetch(int64_t i) {
  if (i < 0 || i >= static_cast<int64_t>(units_.size())) return;
  Unit& u = units_[static_cast<size_t>(i)];
  if (!u.gathered) start_gather(u);
}

void Fsdp::acquire(int64_t i, bool backward) {
  Unit& u = units_[static_cast<size_t>(i)];
  if (!u.gathered) start_gather(u);
  finish_gather(u);
  // The unit this pass reads next, gathered while this one computes: in the forward the next
  // unit until the head; at the head (and a tied embedding read with it) the last layer, when
  // a backward follows; in the backward the layer below (the embedding's backward reads no
  // weights).
  const int64_t head = static_cast<int64_t>(units_.size()) - 1;
  if (backward) {
    if (i - 1 >= 0 && units_[static_cast<size_t>(i - 1)].weights_in_backward) prefetch(i - 1);
  } else if (i == head || head_done_) {
    head_done_ = true;
    if (backward_follows_ && units_[static_cast<size_t>(head - 1)].weights_in_backward)
      prefetch(head - 1);
  } else {
    prefetch(i + 1);
  }
}

bool Fsdp::release(int64_t i, bool backward) {
  Unit& u = units_[static_cast<size_t>(i)];
  if (!u.gathered || !(backward || u.reshard_after_forward)) return false;
  reshard(u);
  return true;
}

void Fsdp::finish_grads() {
  if (!reducing_) return;
  wait(*reducing_);
  reducing_.reset();
  const Unit& u = units_[static_cast<size_t>(reducing_unit_)];
  const int64_t n = u.counts[static_cast<size_t>(group_.rank())];
  float* g = grad_shard_.data() + u.at;
  for (int64_t k = 0; k < n; ++k) g[k] += scratch_[k];
  zero_and_release(model_.grad_data() + u.begin, u.len);
}

void Fsdp::grads_ready(int64_t i) {
  finish_grads();  // the previous unit's, overlapped with this unit's backward
  const Unit& u = units_[static_cast<size_t>(i)];
  const double t0 = cpu::now_seconds();
  reducing_ = group_.reduce_scatter_async(model_.grad_data() + u.begin, scratch_.data(), u.counts);
  exposed_seconds_ += cpu::now_seconds() - t0;
  reducing_unit_ = i;
}

double Fsdp::theory_bytes_per_step(int64_t microbatches) const {
  // Ring volumes: an all-gather or reduce-scatter of B bytes over S ranks sends (S−1)/S·B per
  // rank. Per microbatch each unit is gathered for the forward, again for the backward when it
  // was resharded in between and its backward reads weights (a tied embedding: again for the
  // head), and its gradient reduce-scattered once.
  const double S = static_cast<double>(group_.size());
  double bytes = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    int gathers = 1 + (u.reshard_after_forward && u.weights_in_backward);
    if (i == 0 && tied_ && u.reshard_after_forward) ++gathers;
    bytes += (S - 1) / S * static_cast<double>(u.len) * ((bf16_ ? 2.0 : 4.0) * gathers + 4.0);
  }
  return bytes * static_cast<double>(microbatches);
}

}  // namespace titan::train
