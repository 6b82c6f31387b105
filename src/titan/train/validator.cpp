#include "titan/train/validator.h"

#include <filesystem>
#include <vector>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/log.h"
#include "titan/data/packed_loader.h"

namespace titan::train {

std::string resolved_tokenizer(const config::JobConfig& c) {
  if (c.dataloader.tokenizer != "auto") return c.dataloader.tokenizer;
  if (!c.model.hf_assets_path.empty()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c.model.hf_assets_path + "/tokenizer.json", ec))
      return c.model.hf_assets_path;
  }
  return "byte";
}

namespace {
data::DatasetSpec spec_of(const config::JobConfig& c) {
  data::DatasetSpec s;
  s.source.dataset = c.dataloader.dataset;
  s.source.path = c.dataloader.dataset_path;
  s.source.text_field = c.dataloader.text_field;
  s.source.skip_malformed = c.dataloader.skip_malformed;
  s.tokenizer = resolved_tokenizer(c);
  s.chat.train_on_prompt = c.sft.train_on_prompt;
  s.chat.packing = c.sft.packing;
  s.chat.packing_strategy = c.sft.packing_strategy;
  s.chat.max_tokens = c.training.seq_len + 1;  // one full row of inputs and labels
  s.chat.truncation = c.sft.truncation;
  return s;
}
}  // namespace

data::DatasetSpec dataloader_spec(const config::JobConfig& c) {
  data::DatasetSpec s = spec_of(c);
  s.weights = config::dataset_weights(c);
  if (c.dataloader.tokenizer == "auto" && s.tokenizer != "byte")
    log::info("dataloader.tokenizer auto: using the tokenizer.json of model.hf_assets_path " +
              s.tokenizer);
  return s;
}

data::DatasetSpec validator_spec(const config::JobConfig& c) {
  data::DatasetSpec s = spec_of(c);
  s.source.dataset = c.validator.dataset;
  s.source.path = c.validator.dataset_path;
  s.source.section = "validator";
  return s;
}

void check_vocab_fits(const data::DocumentSet& d, int64_t model_vocab_size) {
  check(d.vocab_size() <= model_vocab_size,
        d.vocab_source() + " has " + std::to_string(d.vocab_size()) +
            " ids but model.vocab_size is " + std::to_string(model_vocab_size) +
            "; set model.vocab_size to at least " + std::to_string(d.vocab_size()) +
            " or use a smaller tokenizer");
}

Validator::Validator(const config::JobConfig& cfg, std::shared_ptr<const data::DocumentSet> docs)
    : docs_(std::move(docs)),
      freq_(cfg.validator.freq),
      steps_(cfg.validator.steps),
      batch_(cfg.training.local_batch_size),
      seq_len_(cfg.training.seq_len),
      path_(cfg.validator.dataset_path) {
  check(freq_ > 0, "validator.freq must be positive");
}

ValidationResult Validator::validate(models::Model& model, dist::Communicator& batch,
                                     int64_t data_rank, int64_t data_world,
                                     const models::CpSlice& cp) const {
  const double t0 = cpu::now_seconds();
  data::LoaderOptions lo;
  lo.batch = batch_;
  lo.seq_len = seq_len_;
  lo.shuffle = false;
  lo.repeat = false;
  lo.dp_rank = data_rank;
  lo.dp_world = data_world;
  data::PackedLoader loader(docs_, lo);
  const int64_t T = batch_ * seq_len_, S = seq_len_ / cp.size;
  std::vector<int32_t> in(T), lab(T), pos(T), mine(cp.active() ? 3 * T / cp.size : 0);
  ValidationResult r;
  double sum = 0;
  while (steps_ < 0 || r.batches < steps_) {
    int64_t out = loader.next(in.data(), lab.data(), pos.data()) == 0 ? 1 : 0;
    batch.all_reduce(&out, 1, dist::ReduceOp::max);  // any rank out of data: all stop
    if (out) break;
    models::Batch b{batch_, seq_len_, in.data(), lab.data(), pos.data()};
    if (cp.active()) {  // this rank's chunks of each row (parallel/context_parallel.h)
      const int64_t n = batch_ * S;
      parallel::split_rows(in.data(), batch_, seq_len_, cp, mine.data());
      parallel::split_rows(lab.data(), batch_, seq_len_, cp, mine.data() + n);
      parallel::split_rows(pos.data(), batch_, seq_len_, cp, mine.data() + 2 * n);
      b = {batch_, S, mine.data(), mine.data() + n, mine.data() + 2 * n};
    }
    ops::LossSum ls = model.forward_loss(b);
    sum += ls.sum;
    r.tokens += ls.count;
    ++r.batches;
  }
  batch.all_reduce(&sum, 1);
  batch.all_reduce(&r.tokens, 1);
  check(r.tokens > 0, "validator.dataset_path '" + path_ + "' gives no complete row of " +
                          std::to_string(seq_len_) +
                          " tokens (training.seq_len); use a larger validation set");
  r.loss = sum / static_cast<double>(r.tokens);
  r.seconds = cpu::now_seconds() - t0;
  return r;
}

}  // namespace titan::train
