#include "titan/train/fsdp.h"

#include <algorithm>

#include "titan/core/cpu.h"
#include "titan/core/error.h"

namespace titan::train {

Fsdp::Fsdp(models::Model& model, dist::Communicator& group, const std::string& policy)
    : model_(model), group_(group) {
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
    units_.push_back(u);
  }
  master_.resize(shard_len_);
  grad_shard_.resize(shard_len_);
  scratch_.resize((largest_unit_ + S - 1) / S);
}

void Fsdp::reshard(Unit& u) {
  zero_and_release(model_.unit_param_data(&u - units_.data()) + u.begin, u.len);
  u.gathered = false;
}

void Fsdp::take_unit(Unit& u) {
  const float* P = model_.param_data();
  std::copy_n(P + u.own, u.counts[static_cast<size_t>(group_.rank())], master_.data() + u.at);
  reshard(u);
  zero_and_release(model_.grad_data() + u.begin, u.len);
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
  for (size_t i = 0; i < units_.size(); ++i) acquire(static_cast<int64_t>(i), false);
}

void Fsdp::acquire(int64_t i, bool /*backward*/) {
  Unit& u = units_[static_cast<size_t>(i)];
  if (u.gathered) return;
  const double t0 = cpu::now_seconds();
  float* P = model_.unit_param_data(i);
  std::copy_n(master_.data() + u.at, u.counts[static_cast<size_t>(group_.rank())], P + u.own);
  group_.all_gather(P + u.begin, u.counts);
  u.gathered = true;
  comm_seconds_ += cpu::now_seconds() - t0;
}

bool Fsdp::release(int64_t i, bool backward) {
  Unit& u = units_[static_cast<size_t>(i)];
  if (!u.gathered || !(backward || u.reshard_after_forward)) return false;
  reshard(u);
  return true;
}

void Fsdp::grads_ready(int64_t i) {
  Unit& u = units_[static_cast<size_t>(i)];
  const double t0 = cpu::now_seconds();
  float* G = model_.grad_data() + u.begin;
  group_.reduce_scatter(G, scratch_.data(), u.counts);
  comm_seconds_ += cpu::now_seconds() - t0;
  const int64_t n = u.counts[static_cast<size_t>(group_.rank())];
  float* g = grad_shard_.data() + u.at;
  for (int64_t k = 0; k < n; ++k) g[k] += scratch_[k];
  zero_and_release(G, u.len);
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
    bytes += (S - 1) / S * 4.0 * static_cast<double>(u.len) * (gathers + 1);
  }
  return bytes * static_cast<double>(microbatches);
}

}  // namespace titan::train
