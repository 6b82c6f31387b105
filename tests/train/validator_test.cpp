// The validator: the token-mean loss over a separate dataset, at step 1 and every freq steps,
// logged as torchtitan's "validate step:" line and a JSONL record, without changing training;
// and the trainer's tokenizer wiring (vocab check, Hugging Face tokenizer).
#include "titan/train/validator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/packed_loader.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

using titan::testing::error_of;

std::vector<std::string> docs() { return titan::testing::fox_docs(); }

// A validation corpus of `lines` text lines.
std::string validation_file(const std::string& name, int lines) {
  const std::string f = titan::testing::fresh_temp_dir(name) + "/valid.txt";
  std::ofstream o(f);
  for (int i = 0; i < lines; ++i) o << "held-out line " << i << " about a slow red hen\n";
  return f;
}

config::JobConfig small() {
  config::JobConfig c = titan::testing::tiny_model_job();
  c.training.local_batch_size = 4;
  c.training.seq_len = 32;
  c.training.steps = 5;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 7;
  return c;
}

TEST(Validator, LossIsTheTokenMeanOverTheWholeSet) {
  config::JobConfig c = small();
  c.validator.enable = true;
  c.validator.dataset_path = validation_file("val_mean", 30);
  Trainer t(c, docs());
  t.step();
  const ValidationResult v = t.validate();

  // The same by hand: one unshuffled pass, forward only.
  data::LoaderOptions lo;
  lo.batch = 4;
  lo.seq_len = 32;
  lo.shuffle = false;
  lo.repeat = false;
  data::PackedLoader loader(data::load_documents("text", c.validator.dataset_path),
                            data::ByteTokenizer(), lo);
  std::vector<int32_t> in(128), lab(128), pos(128);
  double sum = 0, first = 0;
  int64_t count = 0, batches = 0;
  while (loader.next(in.data(), lab.data(), pos.data()) > 0) {
    ops::LossSum ls = t.model().forward_loss({4, 32, in.data(), lab.data(), pos.data()});
    if (batches == 0) first = ls.sum / static_cast<double>(ls.count);
    sum += ls.sum;
    count += ls.count;
    ++batches;
  }
  EXPECT_GT(batches, 2);
  EXPECT_EQ(v.batches, batches);
  EXPECT_EQ(v.tokens, count);
  EXPECT_DOUBLE_EQ(v.loss, sum / static_cast<double>(count));
  EXPECT_EQ(t.validate().loss, v.loss) << "each validation starts from the beginning";

  c.validator.steps = 1;
  Trainer t1(c, docs());
  t1.step();
  EXPECT_EQ(t1.validate().batches, 1);
  EXPECT_DOUBLE_EQ(t1.validate().loss, first);
}

// A non-finite validation loss stops the run with the weights to blame named (it was logged as
// "loss: nan" and training went on).
TEST(Validator, NonFiniteLossIsAnErrorNamingTheWeights) {
  config::JobConfig c = small();
  c.validator.enable = true;
  c.validator.dataset_path = validation_file("val_nan", 10);
  Trainer t(c, docs());
  t.step();
  t.model().store().param_data()[t.model().param("norm.weight").offset] =
      std::numeric_limits<float>::quiet_NaN();
  const std::string msg = titan::testing::error_of([&] { t.validate(); });
  EXPECT_NE(msg.find("step 1: the validation loss on validator.dataset_path"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("1 non-finite value(s) (the first in 'norm.weight')"), std::string::npos)
      << msg;
}

TEST(Validator, DoesNotChangeTraining) {
  config::JobConfig c = small();
  Trainer plain(c, docs());
  c.validator.enable = true;
  c.validator.dataset_path = validation_file("val_same", 10);
  Trainer validated(c, docs());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(plain.step().loss, validated.step().loss) << "step " << i + 1;
    validated.validate();
  }
}

TEST(Validator, TrainLogsValidateLinesAndJsonlRecords) {
  config::JobConfig c = small();
  c.training.steps = 4;
  c.validator.enable = true;
  c.validator.freq = 3;
  c.validator.dataset_path = validation_file("val_log", 10);
  c.metrics.enable_jsonl = true;
  c.metrics.log_freq = 2;
  c.metrics.peak_flops = 1e11;
  c.metrics.disable_color_printing = true;
  c.dump_folder = titan::testing::fresh_temp_dir("val_log_run");
  Trainer t(c, docs());
  ::testing::internal::CaptureStdout();
  t.train();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("validate step:  1  loss: "), std::string::npos) << out;
  EXPECT_NE(out.find("validate step:  3  loss: "), std::string::npos) << out;
  EXPECT_EQ(out.find("validate step:  2"), std::string::npos) << out;
  EXPECT_EQ(out.find("validate step:  4"), std::string::npos) << out;
  std::ifstream j(c.dump_folder + "/metrics.jsonl");
  std::string line;
  std::vector<int64_t> val_steps, train_steps;
  while (std::getline(j, line)) {
    auto rec = nlohmann::json::parse(line);
    if (rec.contains("validation_loss")) {
      val_steps.push_back(rec.at("step").get<int64_t>());
      EXPECT_TRUE(std::isfinite(rec.at("validation_loss").get<double>()));
      EXPECT_GT(rec.at("validation_tokens").get<int64_t>(), 0);
      EXPECT_FALSE(rec.contains("grad_norm"));
    } else {
      train_steps.push_back(rec.at("step").get<int64_t>());
    }
  }
  EXPECT_EQ(val_steps, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(train_steps, (std::vector<int64_t>{1, 2, 4}));
}

TEST(Validator, ConfigAndDatasetErrors) {
  config::JobConfig c = small();
  c.validator.enable = true;
  EXPECT_NE(
      error_of([&] { config::validate(c); }).find("validator.enable needs validator.dataset_path"),
      std::string::npos);
  c.validator.dataset_path = "/nonexistent/valid.txt";
  EXPECT_NE(error_of([&] { Trainer t(c, docs()); })
                .find("dataset path '/nonexistent/valid.txt' does not exist; set "
                      "validator.dataset_path"),
            std::string::npos);
  c.validator.dataset_path = validation_file("val_small", 1);  // one line: under one row
  c.training.seq_len = 64;
  Trainer t(c, docs());
  EXPECT_NE(error_of([&] { t.validate(); }).find("gives no complete row of 64 tokens"),
            std::string::npos);
  c.validator.freq = 0;
  EXPECT_NE(error_of([&] { config::validate(c); }).find("validator.freq must be positive"),
            std::string::npos);
}

TEST(TrainerData, TokenizerVocabMustFitTheModel) {
  config::JobConfig c = small();
  c.dataloader.tokenizer = titan::testing::asset("tokenizers/tiny-bpe-2k");
  const std::string msg = error_of([&] { Trainer t(c, docs()); });
  EXPECT_NE(msg.find("dataloader.tokenizer '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 2020 ids but model.vocab_size is 260; set model.vocab_size to at least "
                     "2020"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(TrainerData, TrainsWithAHuggingFaceTokenizer) {
  config::JobConfig c = small();
  c.model.vocab_size = 2048;
  c.dataloader.tokenizer = titan::testing::asset("tokenizers/tiny-bpe-2k");
  Trainer t(c, docs());
  const double l1 = t.step().loss;
  EXPECT_TRUE(std::isfinite(l1));
  EXPECT_NEAR(l1, std::log(2048.0), 1.0);  // near-uniform at init
  t.step();
  EXPECT_LT(t.step().loss, l1);
}

// dataloader.tokenizer left at its default ignored model.hf_assets_path's tokenizer.json: auto
// now takes it (and stays byte without one, so default runs are unchanged).
TEST(TrainerData, AutoTokenizerTakesTheModelDirectorysTokenizer) {
  config::JobConfig c = small();
  EXPECT_EQ(c.dataloader.tokenizer, "auto");
  EXPECT_EQ(resolved_tokenizer(c), "byte");
  const std::string d = titan::testing::fresh_temp_dir("auto_tok");
  c.model.hf_assets_path = d;
  EXPECT_EQ(resolved_tokenizer(c), "byte");  // no tokenizer.json there
  std::filesystem::copy_file(titan::testing::asset("tokenizers/tiny-bpe-2k/tokenizer.json"),
                             d + "/tokenizer.json");
  EXPECT_EQ(resolved_tokenizer(c), d);
  EXPECT_EQ(dataloader_spec(c).tokenizer, d);
  EXPECT_EQ(validator_spec(c).tokenizer, d);
  c.dataloader.tokenizer = "byte";  // an explicit choice wins
  EXPECT_EQ(resolved_tokenizer(c), "byte");
  // The trainer uses it: the tiny tokenizer's 2020 ids do not fit the 260-id test model.
  c.dataloader.tokenizer = "auto";
  std::filesystem::copy_file(
      std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2/config.json",
      d + "/config.json");
  const std::string msg = error_of([&] { Trainer t(c, docs()); });
  EXPECT_NE(msg.find(d + "/tokenizer.json' has 2020 ids"), std::string::npos) << msg;
}

// The validator's JSON messages suggested validator.skip_malformed, which does not exist.
TEST(ValidatorSpec, MalformedLineHintNamesTheDataloaderOption) {
  config::JobConfig c = small();
  const std::string f = titan::testing::fresh_temp_dir("val_bad") + "/valid.jsonl";
  std::ofstream(f) << "{not json\n";
  c.validator.enable = true;
  c.validator.dataset_path = f;
  const std::string msg = error_of([&] { data::read_documents(validator_spec(c).source); });
  EXPECT_NE(msg.find(f + ":1: the line is malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set dataloader.skip_malformed = true"), std::string::npos) << msg;
}

}  // namespace
}  // namespace titan::train
