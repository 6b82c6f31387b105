// torchtitan's validator (torchtitan.md §1.4, §4.3-4.4): with validator.enable, after the
// checkpoint of step 1 and of every validator.freq-th step, the model's loss (forward only, no
// gradients) over validator.steps batches of a separate dataset (-1: one whole pass), read from
// its start without shuffling, at the training batch and sequence sizes; logged as
// "validate step: N  loss: X  memory: ...  tps: ..." and as a JSONL record. The loss is the
// token mean over every batch (the mean of per-batch means when the batches are full).
// With data parallelism each rank of the batch group reads its own documents (r, r+N, ...), all
// ranks run the same number of batches (they stop together when one has no full row left: the
// forward may gather sharded parameters), and the sums are all-reduced.
#pragma once
#include <cstdint>
#include <memory>

#include "titan/config/job_config.h"
#include "titan/data/dataset.h"
#include "titan/dist/communicator.h"
#include "titan/models/model.h"
#include "titan/parallel/context_parallel.h"

namespace titan::train {

// dataloader.tokenizer with "auto" resolved: model.hf_assets_path when it holds a
// tokenizer.json, else "byte".
std::string resolved_tokenizer(const config::JobConfig& c);

// The dataset specs of dataloader.* and of validator.* (which shares the dataloader's
// tokenizer, text field and skip_malformed). dataloader_spec logs one line when
// dataloader.tokenizer auto picks model.hf_assets_path's tokenizer.
data::DatasetSpec dataloader_spec(const config::JobConfig& c);
data::DatasetSpec validator_spec(const config::JobConfig& c);

// Throws titan::Error when the dataset's ids do not fit model.vocab_size.
void check_vocab_fits(const data::DocumentSet& d, int64_t model_vocab_size);

struct ValidationResult {
  double loss = 0;
  int64_t tokens = 0;   // labels that counted
  int64_t batches = 0;  // batches evaluated (by this rank)
  double seconds = 0;
};

class Validator {
 public:
  Validator(const config::JobConfig& cfg, std::shared_ptr<const data::DocumentSet> docs);
  bool should_validate(int64_t step) const { return step == 1 || step % freq_ == 0; }
  // Forward only; the model's parameters and gradients are untouched.
  // batch: the data-parallel group and, under context parallelism, the ranks holding the other
  // chunks of its rows (the loss and token count are over all of it); this rank reads the rows
  // of data rank data_rank of data_world and, under CP, keeps its chunks of each (cp).
  ValidationResult validate(models::Model& model, dist::Communicator& batch, int64_t data_rank,
                            int64_t data_world, const models::CpSlice& cp = {}) const;

 private:
  std::shared_ptr<const data::DocumentSet> docs_;
  int64_t freq_, steps_, batch_, seq_len_;
  std::string path_;
};

}  // namespace titan::train
