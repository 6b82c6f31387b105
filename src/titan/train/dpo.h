// Direct Preference Optimization (Rafailov et al. 2023) as TRL's DPOTrainer computes it, one more
// training objective beside the next-token loss (config dpo.*).
//
// For a pair (prompt x, chosen y_w, rejected y_l), with log-probabilities summed over the
// completion tokens (for loss_type ipo: averaged over them) under the policy (π) and the frozen
// reference (ref):
//   h = (π(y_w) − π(y_l)) − (ref(y_w) − ref(y_l))
//   sigmoid: −log σ(β h)
//   hinge:   max(0, 1 − β h)
//   ipo:     (h − 1 / (2β))²
//   robust:  (−(1 − ε) log σ(β h) + ε log σ(−β h)) / (1 − 2ε)        ε = label_smoothing
// The step's loss is the mean over the step's pairs (every data-parallel rank's). Rewards:
// β (π(y) − ref(y)) for chosen and rejected; TRL's metrics are their means, the share of pairs
// whose chosen reward exceeds the rejected one, the mean margin and the mean log-probabilities.
//
// The gradient: each pair's loss depends on the policy only through π(y_w) and π(y_l), sums of
// per-token log-probabilities, so it is the next-token loss's gradient of each sequence scaled by
// −∂loss/∂π(y) (Σ log p = −Σ CE). dpo_forward_backward runs every completion as its own
// microbatch row: one forward for π, then one forward+backward with that scale. No kernel knows
// of DPO, so it composes with every parallel layout, LoRA, bf16 and activation checkpointing.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/data/preference.h"
#include "titan/models/model.h"

namespace titan::train {

// Log-probabilities (summed over the completion tokens) of each completion of a pair.
struct PairLogps {
  double chosen = 0, rejected = 0;
};

struct DpoLossTerms {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // ∂loss/∂π(y_w), ∂loss/∂π(y_l) (of the sums)
  double reward_chosen = 0, reward_rejected = 0;
};

// One pair's loss from the policy's and the reference's summed log-probabilities and the
// completions' token counts (ipo averages over them; the rewards use the sums, as TRL's).
DpoLossTerms dpo_loss(const config::DpoConfig& c, const PairLogps& policy, const PairLogps& ref,
                      int64_t chosen_tokens, int64_t rejected_tokens);

using data::PreferencePair;

// The step's sums over pairs, for the metrics (summed over data-parallel ranks by the caller).
struct DpoSums {
  double loss = 0;
  double reward_chosen = 0, reward_rejected = 0, accurate = 0, margin = 0;
  double logps_chosen = 0, logps_rejected = 0;
  int64_t pairs = 0;
  int64_t tokens = 0;             // through the model: both rows' input tokens
  int64_t completion_tokens = 0;  // the log-probabilities' (the loss's valid labels)
  double aux_loss = 0;            // MoE: Σ of each training pass's auxiliary loss
  // TRL's names: rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
  // logps/chosen, logps/rejected (means over pairs).
  std::vector<std::pair<std::string, double>> metrics() const;
};

// A completion as a microbatch of one row: the ids prompt + completion without the last, labels
// the next ids on the completion (−100 on the prompt), positions 0.. . pad_to: the row length
// is rounded up to a multiple (sequence parallelism), padded with ignored labels.
struct SequenceRow {
  std::vector<int32_t> input, labels, positions;
  int64_t completion_tokens = 0;
  models::Batch batch() const {
    return {1, static_cast<int64_t>(input.size()), input.data(), labels.data(), positions.data()};
  }
};
SequenceRow sequence_row(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                         int64_t pad_to = 1);

// Σ log p of both completions (forward only).
PairLogps pair_logps(models::Model& m, const PreferencePair& p, int64_t pad_to = 1);

// One step's forward and backward over this rank's pairs: gradients accumulate (+=) in the
// model scaled for the mean over global_pairs. ref[i]: the reference log-probabilities of
// pairs[i]. Returns this rank's sums.
DpoSums dpo_forward_backward(models::Model& m, const config::DpoConfig& c,
                             const std::vector<PreferencePair>& pairs,
                             const std::vector<PairLogps>& ref, int64_t global_pairs,
                             int64_t pad_to = 1);

// The order pairs are trained in, as the packed loader orders documents: epoch 0 in the file's
// order (so the first P positions are pairs 0 .. P − 1, whatever the shuffle); with shuffle each
// later epoch reshuffles the one before (Fisher–Yates over a counter-based stream per epoch).
class PairOrder {
 public:
  PairOrder(int64_t pairs, bool shuffle, uint64_t seed);
  // The pair at global position g (epoch g / pairs).
  int64_t at(int64_t g);

 private:
  int64_t n_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

// The reference log-probabilities of pairs [0, n) under m (the starting weights) for data-parallel
// rank `rank` of `ranks`: it computes pairs i with i % ranks == rank and leaves the others 0, so
// that their sum over the ranks holds every pair. Every rank calls the model ⌈n / ranks⌉ times
// (the passes of FSDP and expert parallelism are collectives).
std::vector<PairLogps> reference_logps(models::Model& m, const std::vector<PreferencePair>& pairs,
                                       int64_t n, int64_t rank, int64_t ranks, int64_t pad_to = 1);

// A file of reference log-probabilities: magic "TITANDPO", version 1 (u32), the pairs'
// fingerprint (XXH3-64 of their ids, u64), the count n (u64), then n (chosen, rejected) doubles,
// little-endian. Written through a temporary name. Reading checks all of it against the pairs
// and throws titan::Error naming the file and what to do.
void save_reference_logps(const std::string& path, const std::vector<PreferencePair>& pairs,
                          const std::vector<PairLogps>& logps);
std::vector<PairLogps> load_reference_logps(const std::string& path,
                                            const std::vector<PreferencePair>& pairs);

}  // namespace titan::train
