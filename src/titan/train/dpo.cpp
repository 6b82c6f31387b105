#include "titan/train/dpo.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/rng.h"
#include "titan/ops/loss.h"

namespace titan::train {
namespace {

double log_sigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

}  // namespace

DpoLossTerms dpo_loss(const config::DpoConfig& c, const PairLogps& policy, const PairLogps& ref,
                      int64_t chosen_tokens, int64_t rejected_tokens) {
  // ipo: TRL divides each completion's log-probabilities by its token count (at least 1).
  const bool ipo = c.loss_type == "ipo";
  const double nw = ipo ? static_cast<double>(std::max<int64_t>(chosen_tokens, 1)) : 1.0;
  const double nl = ipo ? static_cast<double>(std::max<int64_t>(rejected_tokens, 1)) : 1.0;
  const double b = c.beta,
               h = (policy.chosen - ref.chosen) / nw - (policy.rejected - ref.rejected) / nl;
  DpoLossTerms t;
  double dh = 0;  // ∂loss/∂h
  if (c.loss_type == "sigmoid") {
    t.loss = -log_sigmoid(b * h);
    dh = -b * sigmoid(-b * h);
  } else if (c.loss_type == "hinge") {
    t.loss = std::max(0.0, 1.0 - b * h);
    dh = 1.0 - b * h > 0 ? -b : 0.0;  // torch's relu: no gradient at 0
  } else if (c.loss_type == "ipo") {
    const double d = h - 1.0 / (2.0 * b);
    t.loss = d * d;
    dh = 2.0 * d;
  } else if (c.loss_type == "robust") {
    const double e = c.label_smoothing;
    t.loss = (-(1.0 - e) * log_sigmoid(b * h) + e * log_sigmoid(-b * h)) / (1.0 - 2.0 * e);
    dh = (-(1.0 - e) * b * sigmoid(-b * h) - e * b * sigmoid(b * h)) / (1.0 - 2.0 * e);
  } else {
    throw Error("dpo.loss_type '" + c.loss_type + "' must be sigmoid, ipo, hinge or robust");
  }
  t.d_chosen = dh / nw;
  t.d_rejected = -dh / nl;
  t.reward_chosen = b * (policy.chosen - ref.chosen);
  t.reward_rejected = b * (policy.rejected - ref.rejected);
  return t;
}

std::vector<std::pair<std::string, double>> DpoSums::metrics() const {
  const double n = pairs > 0 ? static_cast<double>(pairs) : std::nan("");
  return {{"rewards/chosen", reward_chosen / n}, {"rewards/rejected", reward_rejected / n},
          {"rewards/accuracies", accurate / n},  {"rewards/margins", margin / n},
          {"logps/chosen", logps_chosen / n},    {"logps/rejected", logps_rejected / n}};
}

SequenceRow sequence_row(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                         int64_t pad_to) {
  check(!completion.empty(), "a preference pair has an empty completion");
  SequenceRow r;
  const int64_t n = static_cast<int64_t>(prompt.size() + completion.size());
  const int64_t S0 = n - 1, S = (S0 + pad_to - 1) / pad_to * pad_to;
  check(S0 >= 1, "a preference pair's prompt and completion hold fewer than two tokens");
  r.input.assign(static_cast<size_t>(S), 0);
  r.labels.assign(static_cast<size_t>(S), ops::kIgnoreIndex);
  r.positions.resize(static_cast<size_t>(S));
  const auto id = [&](int64_t i) {
    return i < static_cast<int64_t>(prompt.size())
               ? prompt[static_cast<size_t>(i)]
               : completion[static_cast<size_t>(i - static_cast<int64_t>(prompt.size()))];
  };
  for (int64_t j = 0; j < S; ++j) {
    r.positions[static_cast<size_t>(j)] = static_cast<int32_t>(j);
    if (j >= S0) continue;  // padding: after every real token, so causal attention ignores it
    r.input[static_cast<size_t>(j)] = id(j);
    if (j + 1 >= static_cast<int64_t>(prompt.size())) r.labels[static_cast<size_t>(j)] = id(j + 1);
  }
  r.completion_tokens = static_cast<int64_t>(completion.size());
  return r;
}

PairLogps pair_logps(models::Model& m, const PreferencePair& p, int64_t pad_to) {
  PairLogps r;
  r.chosen = -m.forward_loss(sequence_row(p.prompt, p.chosen, pad_to).batch()).sum;
  r.rejected = -m.forward_loss(sequence_row(p.prompt, p.rejected, pad_to).batch()).sum;
  return r;
}

DpoSums dpo_forward_backward(models::Model& m, const config::DpoConfig& c,
                             const std::vector<PreferencePair>& pairs,
                             const std::vector<PairLogps>& ref, int64_t global_pairs,
                             int64_t pad_to) {
  check(ref.size() == pairs.size(), "DPO: one reference entry per pair");
  check(global_pairs > 0, "DPO: a step without pairs");
  const double inv_pairs = 1.0 / static_cast<double>(global_pairs);
  // Each sequence's auxiliary MoE loss weighs 1 / (2 · global pairs): the step's term is the mean
  // over its sequences, as the next-token objective's is over its microbatches.
  const float aux_weight = static_cast<float>(0.5 * inv_pairs);
  const models::RoutingStats* routing = m.routing();
  DpoSums s;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PreferencePair& p = pairs[i];
    const SequenceRow cw = sequence_row(p.prompt, p.chosen, pad_to);
    const SequenceRow cl = sequence_row(p.prompt, p.rejected, pad_to);
    const PairLogps pi{-m.forward_loss(cw.batch()).sum, -m.forward_loss(cl.batch()).sum};
    const DpoLossTerms t = dpo_loss(c, pi, ref[i], cw.completion_tokens, cl.completion_tokens);
    // π(y) = −Σ CE: each sequence's CE gradient scaled by −∂loss/∂π(y), over the step's pairs.
    m.forward_backward(cw.batch(), static_cast<float>(-t.d_chosen * inv_pairs), aux_weight);
    if (routing) s.aux_loss += routing->last_aux_loss();
    m.forward_backward(cl.batch(), static_cast<float>(-t.d_rejected * inv_pairs), aux_weight);
    if (routing) s.aux_loss += routing->last_aux_loss();
    s.loss += t.loss;
    s.reward_chosen += t.reward_chosen;
    s.reward_rejected += t.reward_rejected;
    s.accurate += t.reward_chosen > t.reward_rejected ? 1.0 : 0.0;
    s.margin += t.reward_chosen - t.reward_rejected;
    s.logps_chosen += pi.chosen;
    s.logps_rejected += pi.rejected;
    s.pairs += 1;
    s.tokens += static_cast<int64_t>(p.prompt.size() * 2 + p.chosen.size() + p.rejected.size()) - 2;
    s.completion_tokens += cw.completion_tokens + cl.completion_tokens;
  }
  return s;
}

PairOrder::PairOrder(int64_t pairs, bool shuffle, uint64_t seed)
    : n_(pairs), shuffle_(shuffle), seed_(seed), order_(static_cast<size_t>(pairs)) {
  check(pairs > 0, "DPO: no preference pairs");
  for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = i;
}

int64_t PairOrder::at(int64_t g) {
  const int64_t e = g / n_;
  if (shuffle_) {
    if (e < epoch_) {  // back to an earlier epoch (not in training, which moves forward)
      for (int64_t i = 0; i < n_; ++i) order_[static_cast<size_t>(i)] = i;
      epoch_ = 0;
    }
    for (; epoch_ < e; ++epoch_)
      for (int64_t i = n_ - 1; i > 0; --i) {
        const uint64_t r =
            random_u64(seed_, static_cast<uint64_t>(epoch_ + 1), static_cast<uint64_t>(i));
        std::swap(order_[static_cast<size_t>(i)],
                  order_[static_cast<size_t>(r % static_cast<uint64_t>(i + 1))]);
      }
  }
  return order_[static_cast<size_t>(g % n_)];
}

std::vector<PairLogps> reference_logps(models::Model& m, const std::vector<PreferencePair>& pairs,
                                       int64_t n, int64_t rank, int64_t ranks, int64_t pad_to) {
  std::vector<PairLogps> r(static_cast<size_t>(n));
  // Every rank runs the same number of forwards: under FSDP or expert parallelism each is a
  // collective of the group. A rank past the end runs pair 0 again and keeps nothing of it.
  const int64_t rounds = (n + ranks - 1) / ranks;
  for (int64_t j = 0; j < rounds; ++j) {
    const int64_t i = j * ranks + rank;
    const PairLogps l = pair_logps(m, pairs[static_cast<size_t>(i < n ? i : 0)], pad_to);
    if (i < n) r[static_cast<size_t>(i)] = l;
  }
  return r;
}

namespace {

constexpr char kRefMagic[8] = {'T', 'I', 'T', 'A', 'N', 'D', 'P', 'O'};
constexpr uint32_t kRefVersion = 1;

uint64_t fingerprint(const std::vector<PreferencePair>& pairs) {
  XXH3_state_t* st = XXH3_createState();
  check(st != nullptr, "out of memory hashing the preference pairs");
  XXH3_64bits_reset(st);
  for (const auto& p : pairs)
    for (const auto* v : {&p.prompt, &p.chosen, &p.rejected}) {
      const uint64_t len = v->size();
      XXH3_64bits_update(st, &len, sizeof len);
      XXH3_64bits_update(st, v->data(), v->size() * sizeof(int32_t));
    }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

void save_reference_logps(const std::string& path, const std::vector<PreferencePair>& pairs,
                          const std::vector<PairLogps>& logps) {
  std::string data(kRefMagic, sizeof kRefMagic);
  const auto put = [&](const void* p, size_t n) { data.append(static_cast<const char*>(p), n); };
  const uint64_t fp = fingerprint(pairs), n = logps.size();
  put(&kRefVersion, sizeof kRefVersion);
  put(&fp, sizeof fp);
  put(&n, sizeof n);
  for (const auto& l : logps) {
    put(&l.chosen, sizeof l.chosen);
    put(&l.rejected, sizeof l.rejected);
  }
  io::write_file_atomic(path, data);
}

std::vector<PairLogps> load_reference_logps(const std::string& path,
                                            const std::vector<PreferencePair>& pairs) {
  const std::string redo =
      "; it holds the reference log-probabilities of the starting weights, which a resume "
      "cannot recompute: start the run again from step 0 (another dump_folder)";
  std::ifstream f(path, std::ios::binary);
  check(f.good(), path + ": cannot read (" + io::errno_message(errno) + ")" + redo);
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t head = sizeof kRefMagic + sizeof(uint32_t) + 2 * sizeof(uint64_t);
  check(data.size() >= head && std::memcmp(data.data(), kRefMagic, sizeof kRefMagic) == 0,
        path + ": not a titan DPO reference file" + redo);
  uint32_t version = 0;
  uint64_t fp = 0, n = 0;
  std::memcpy(&version, data.data() + 8, sizeof version);
  std::memcpy(&fp, data.data() + 12, sizeof fp);
  std::memcpy(&n, data.data() + 20, sizeof n);
  check(version == kRefVersion, path + ": version " + std::to_string(version) +
                                    " is not the supported " + std::to_string(kRefVersion) + redo);
  check(n <= pairs.size() && data.size() == head + n * 2 * sizeof(double),
        path + ": truncated or of another dataset (" + std::to_string(n) + " pairs, " +
            std::to_string(data.size()) + " bytes)" + redo);
  check(fp == fingerprint(pairs),
        path + ": computed for other preference pairs than this run's dataset" + redo);
  std::vector<PairLogps> r(n);
  std::memcpy(r.data(), data.data() + head, n * 2 * sizeof(double));
  return r;
}

}  // namespace titan::train
