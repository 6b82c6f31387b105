// The titan command line, run as a user would: each bad input is one clear line and a non-zero
// exit; nothing crashes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/ops/device.h"

namespace {

using Result = ::titan::testing::CliResult;
Result titan(const std::string& args) { return ::titan::testing::run_titan(args); }

// one_line: the error is all that is printed (false where log lines legitimately precede it).
void expect_error(const std::string& args, const std::string& needle, bool one_line = true) {
  Result r = titan(args);
  EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("titan: error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << r.out;
  // One line, no stack trace.
  if (one_line) {
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

std::string temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("titan_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

TEST(Cli, ConfigShowPrintsResolvedConfig) {
  Result r = titan("config show --config qwen3_debugmodel --training.steps=7 --model.n_layers 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("steps = 7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n_layers=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vocab_size=2048"), std::string::npos) << r.out;
}

// eval's logits file: the log says with which weights they were computed and, under bf16, how to
// compare them with Transformers' fp32 forward.
TEST(Cli, EvalLogitsOutSaysThePrecision) {
  const std::string fixture = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2";
  const std::string out = ::testing::TempDir() + "titan_eval_logits.safetensors";
  Result r = titan("eval --config qwen3_debugmodel --model.hf_assets_path " + fixture +
                   " --training.seq_len 64 --eval.tokens_path " + fixture +
                   "/expected.safetensors --eval.logits_out " + out);
  std::filesystem::remove(out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(computed with bfloat16 weights; compared with Transformers' fp32"),
            std::string::npos)
      << r.out;
}

// A config whose model folder does not exist yet is shown, with one line saying so.
TEST(Cli, ConfigShowWithAMissingAssetFolderSaysSo) {
  Result r =
      titan("config show --config v5_qwen3_4b_finetune --model.hf_assets_path /nonexistent/q");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("hf_assets_path = \"/nonexistent/q\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# model.hf_assets_path '/nonexistent/q' does not exist"), std::string::npos)
      << r.out;
}

TEST(Cli, ConfigListNamesEveryFlavor) {
  Result r = titan("config list");
  ASSERT_EQ(r.code, 0);
  for (const char* n : {"qwen3_debugmodel", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b",
                        "qwen3_14b", "qwen3_32b"})
    EXPECT_NE(r.out.find(n), std::string::npos) << n;
}

TEST(Cli, UnknownConfigListsAvailable) { expect_error("train --config qwen3_nope", "available: "); }

TEST(Cli, UnknownFlagSuggestsNearest) {
  expect_error("train --config qwen3_debugmodel --training.stepz 3",
               "did you mean --training.steps");
}

TEST(Cli, WrongTypeNamesFlag) {
  expect_error("train --config qwen3_debugmodel --training.steps three",
               "--training.steps expects an integer, got 'three'");
  expect_error("train --config qwen3_debugmodel --optimizer.lr=fast",
               "--optimizer.lr expects a number");
}

TEST(Cli, MissingConfigAndUnknownFlavor) {
  expect_error("train --training.steps 3", "--config is required");
  expect_error("config show --config qwen3_debugmodel --model.flavor 3B", "model.flavor '3B'");
}

TEST(Cli, SeqLenBeyondFlavorMaximum) {
  expect_error("config show --config qwen3_debugmodel --training.seq_len 8192",
               "exceeds the maximum context");
}

TEST(Cli, MissingDataset) {
  expect_error("train --config qwen3_debugmodel --dataloader.dataset_path /nonexistent/x.txt",
               "/nonexistent/x.txt");
}

TEST(Cli, EmptyDataset) {
  std::string f = temp_dir() + "/empty.txt";
  std::ofstream(f) << "\n\n";
  expect_error(
      "train --config qwen3_debugmodel --dataloader.dataset text --dataloader.dataset_path " + f,
      "has no documents");
}

TEST(Cli, InvalidUtf8IsReplacedCountedAndReported) {
  std::string f = temp_dir() + "/bad.txt";
  std::ofstream(f, std::ios::binary) << "fine line\nbad \xff byte\n";
  Result r = titan("tokenize --input " + f + " --output " + temp_dir() + "/bad.bin");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("replaced 1 invalid UTF-8 sequence(s) with U+FFFD (first at " + f + ":2)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("wrote 2 documents"), std::string::npos) << r.out;
}

// A Hugging Face directory copied from a fixture, then damaged by `damage`.
std::string broken_hf_dir(const std::string& name, void (*damage)(const std::string& dir)) {
  std::string dir = temp_dir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::copy(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/tied_gqa2", dir);
  damage(dir);
  return dir;
}

TEST(Cli, BadHuggingFaceDirectories) {
  const std::string eval =
      "eval --config qwen3_debugmodel --training.seq_len 16 --eval.steps 1 "
      "--model.hf_assets_path ";
  std::string d = broken_hf_dir("truncated", [](const std::string& dir) {
    std::filesystem::resize_file(dir + "/model.safetensors", 1000);
  });
  expect_error(eval + d, d + "/model.safetensors");
  d = broken_hf_dir("llama", [](const std::string& dir) {
    std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  });
  expect_error(eval + d, "field 'architectures'");
  d = broken_hf_dir("nohidden", [](const std::string& dir) {
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "qwen3", "vocab_size": 1000, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 64})";
  });
  expect_error(eval + d, "field 'hidden_size' is required");
  d = broken_hf_dir("shape", [](const std::string& dir) {
    std::ofstream(dir + "/config.json", std::ios::app);  // keep the file, change the model below
  });
  expect_error(eval + d + " --model.hidden_dim 65",
               "wrong shapes: model.layers.0.mlp.down_proj.weight");
  expect_error(eval + "/nonexistent/model", "/nonexistent/model/config.json");
  // config.json ties the head, but the weights carry their own, different lm_head.weight.
  d = temp_dir() + "/tied_but_untied";
  std::filesystem::remove_all(d);
  std::filesystem::copy(std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/untied_gqa1", d);
  {
    std::ifstream in(d + "/config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    c["tie_word_embeddings"] = true;
    std::ofstream(d + "/config.json") << c.dump();
  }
  expect_error(eval + d, d + ": config.json has tie_word_embeddings true, but the weights carry "
                             "an lm_head.weight that differs from model.embed_tokens.weight");
}

TEST(Cli, EvalReportsPerplexity) {
  std::string f = temp_dir() + "/eval_corpus.txt";
  std::ofstream(f) << "some text to evaluate on\nanother line of it\n";
  Result r = titan(
      "eval --config qwen3_debugmodel --training.seq_len 16 --training.local_batch_size 2 "
      "--eval.steps 2 --dataloader.dataset text --dataloader.dataset_path " +
      f + " --model.hf_assets_path " + std::string(TITAN_SOURCE_DIR) +
      "/tests/fixtures/hf/tied_gqa2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
}

TEST(Cli, OverrideLogsOneLinePerLayerAndCheckKernelIsExact) {
  const std::string so = std::string(TITAN_PLUGIN_DIR) + "/libtitan_layout_rope.so";
  Result r = titan(
      "check-kernel --config qwen3_debugmodel --model.n_layers 2 --training.seq_len 128 "
      "--training.local_batch_size 1 --override.imports " +
      so);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[Override] layout_rope: model.layers.0.attention.rope CosSinRoPE.Config -> "
                       "LayoutRoPE.Config"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[Override] layout_rope: model.layers.1.attention.rope"), std::string::npos);
  EXPECT_NE(r.out.find("Applied 2 override(s)"), std::string::npos);
  EXPECT_NE(r.out.find("bf16 inputs]: forward max abs 0 rel 0 | backward max abs 0 rel 0"),
            std::string::npos)
      << r.out;
  expect_error("train --config qwen3_debugmodel --training.seq_len 100 --override.imports " + so,
               "multiple of 128, got 100", false);
  expect_error("train --config qwen3_debugmodel --module /nonexistent/plugin.so",
               "cannot load plugin '/nonexistent/plugin.so'");
  // --module registers config functions.
  r = titan("config list --module " + std::string(TITAN_PLUGIN_DIR) + "/libtitan_test_throwing.so");
  EXPECT_NE(r.out.find("throwing_debugmodel"), std::string::npos) << r.out;
}

TEST(Cli, TrainsAndWritesMetrics) {
  std::string dir = temp_dir() + "/run";
  std::string f = temp_dir() + "/corpus.txt";
  {
    std::ofstream o(f);
    for (int i = 0; i < 50; ++i) o << "line " << i << " of a small corpus for the cli test\n";
  }
  Result r = titan(
      "train --config qwen3_debugmodel --model.n_layers 1 --model.dim 64 "
      "--training.steps 2 --training.seq_len 64 --training.local_batch_size 2 "
      "--metrics.log_freq 1 --metrics.peak_flops 1e11 --dataloader.dataset text "
      "--dataloader.dataset_path " +
      f + " --dump_folder " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step:  2  loss: "), std::string::npos) << r.out;
  std::ifstream j(dir + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(j, line)) {
    ++lines;
    EXPECT_NE(line.find("\"grad_norm\""), std::string::npos);
    EXPECT_NE(line.find("\"data_loading_time_s\""), std::string::npos);
  }
  EXPECT_EQ(lines, 2);
}

std::string assets() {
  if (const char* env = std::getenv("TITAN_ASSETS"); env && *env) return env;
  return std::string(TITAN_SOURCE_DIR) + "/../shared/assets";
}

TEST(Cli, TokenizePrintsIds) {
  Result r = titan("tokenize --tokenizer " + assets() + "/tokenizers/qwen3 --text 'hello world'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "14990 1879\n");
  r = titan("tokenize --text hi --bos_eos");  // byte-level: BOS 256, bytes, EOS 257
  EXPECT_EQ(r.out, "256 104 105 257\n");
}

TEST(Cli, TokenizeBadInput) {
  const std::string d = temp_dir();
  expect_error("tokenize --text hi --input x", "exactly one of --text TEXT and --input PATH");
  expect_error("tokenize --input " + d, "--input needs --output FILE.bin");
  expect_error("tokenize --frobnicate 1", "titan tokenize: unknown option '--frobnicate'");
  expect_error("tokenize --tokenizer /nonexistent/tok --text hi", "'/nonexistent/tok' is neither");
  expect_error("tokenize --input " + d + "/nothing*.jsonl --output " + d + "/o.bin",
               "matches no files");
  const std::string bad = d + "/bad.jsonl";
  std::ofstream(bad) << "{\"text\": \"ok\"}\n{\"text\": oops}\n{\"body\": \"x\"}\n";
  expect_error("tokenize --input " + bad + " --output " + d + "/o.bin",
               bad + ":2: the line is malformed JSON");
  const std::string nofield = d + "/nofield.jsonl";
  std::ofstream(nofield) << "{\"text\": \"ok\"}\n";
  expect_error("tokenize --input " + nofield + " --text_field body --output " + d + "/o.bin",
               nofield + ":1: no field 'body'");
  const std::string empty = d + "/empty.jsonl";
  std::ofstream(empty) << "{\"text\": \"\"}\n";
  expect_error("tokenize --input " + empty + " --output " + d + "/o.bin", "has no documents");
  Result r = titan("tokenize --skip_malformed --input " + bad + " --output " + d + "/o.bin");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped 1 malformed JSON line(s) (first at " + bad +
                       ":2); skipped 1 JSON "
                       "line(s) without a string 'text' field (first at " +
                       bad + ":3)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("wrote 1 documents"), std::string::npos) << r.out;
}

TEST(Cli, BadTokenShardNamesTheFile) {
  const std::string g = temp_dir() + "/garbage.bin";
  std::ofstream(g) << "this is not a shard at all, but it is long enough to hold a header....";
  expect_error("train --config qwen3_debugmodel --dataloader.dataset_path " + g,
               g + ": not a titan token shard (bad magic");
  const std::string s = temp_dir() + "/short.bin";
  std::ofstream(s) << "TITANTOK";
  expect_error(
      "train --config qwen3_debugmodel --dataloader.dataset tokens "
      "--dataloader.dataset_path " +
          s,
      s + ": not a titan token shard (8 bytes");
}

TEST(Cli, TokenizerVocabMustFitTheModel) {
  std::string f = temp_dir() + "/vocab_corpus.txt";
  std::ofstream(f) << "a line\n";
  expect_error(
      "train --config qwen3_debugmodel --model.vocab_size 1000 --dataloader.tokenizer " + assets() +
          "/tokenizers/tiny-bpe-2k --dataloader.dataset text --dataloader.dataset_path " + f,
      "tokenizer.json' has 2020 ids but model.vocab_size is 1000", false);
}

TEST(Cli, TrainsOnATokenShardWithValidation) {
  const std::string d = temp_dir(), tok = assets() + "/tokenizers/tiny-bpe-2k";
  {
    std::ofstream o(d + "/train.jsonl");
    for (int i = 0; i < 60; ++i) o << "{\"text\": \"record " << i << " of the training set\"}\n";
    std::ofstream v(d + "/valid.txt");
    for (int i = 0; i < 20; ++i) v << "held-out line " << i << "\n";
  }
  Result r = titan("tokenize --tokenizer " + tok + " --input " + d + "/train.jsonl --output " + d +
                   "/train.bin");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string run = d + "/shard_run";
  std::filesystem::remove_all(run);
  r = titan(
      "train --config qwen3_debugmodel --model.n_layers 1 --model.dim 64 --training.steps 2 "
      "--training.seq_len 32 --training.local_batch_size 2 --metrics.log_freq 1 "
      "--metrics.peak_flops 1e11 --dataloader.dataset_path " +
      d + "/train.bin --dataloader.tokenizer " + tok +
      " --validator.enable --validator.freq 2 --validator.dataset_path " + d +
      "/valid.txt --dump_folder " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("60 pre-tokenized documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validate step:  1  loss: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validate step:  2  loss: "), std::string::npos) << r.out;
  std::ifstream j(run + "/metrics.jsonl");
  std::string line;
  int validation = 0;
  while (std::getline(j, line)) validation += line.find("\"validation_loss\"") != std::string::npos;
  EXPECT_EQ(validation, 2);
}

// ---- bad input: each is one `titan: error:` line naming the file or field (exit 1), never a
// signal or an internal error.

std::string tiny_train(const std::string& dump) {
  return "train --config qwen3_debugmodel --model.n_layers 1 --model.dim 64 --training.steps 1 "
         "--training.seq_len 16 --training.local_batch_size 1 --metrics.peak_flops 1e11 "
         "--metrics.enable_jsonl false --dump_folder " +
         dump;
}

// num_attention_heads 0 without head_dim: SIGFPE (no message) in train, eval and config show.
TEST(CliBadInput, ZeroHeadsInConfigJson) {
  const std::string d = broken_hf_dir("zero_heads", [](const std::string& dir) {
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 0, "intermediate_size": 64})";
  });
  const std::string want = d + "/config.json: field 'num_attention_heads' must be positive, got 0";
  expect_error("config show --config qwen3_debugmodel --model.hf_assets_path " + d, want);
  expect_error("train --config qwen3_debugmodel --model.hf_assets_path " + d, want);
  expect_error("eval --config qwen3_debugmodel --model.hf_assets_path " + d, want);
}

// Absurd sizes: std::bad_alloc or a wrapped -1 before; now one line naming the field or the
// memory the model needs.
TEST(CliBadInput, AbsurdModelSizes) {
  const std::string t = tiny_train(temp_dir() + "/absurd");
  expect_error(t + " --model.hidden_dim 10000000000",
               "for its parameters, gradients and optimizer state; this machine has");
  expect_error(t + " --model.vocab_size 1000000000000",
               "model.vocab_size 1000000000000 is out of range (token ids are 32-bit");
  expect_error(
      "train --config qwen3_debugmodel_moe --training.seq_len 16 --model.num_experts 1000000",
      "(or model.num_experts, model.moe_hidden_dim)");
  expect_error(t + " --model.vocab_size 18446744073709551615",
               "got '18446744073709551615', which is out of range");
  std::string d = broken_hf_dir("huge_vocab", [](const std::string& dir) {
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "qwen3", "vocab_size": 18446744073709551615, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64})";
  });
  expect_error("eval --config qwen3_debugmodel --model.hf_assets_path " + d,
               d + "/config.json: field 'vocab_size' is 18446744073709551615, out of range");
  d = broken_hf_dir("huge_ffn", [](const std::string& dir) {
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 10000000000})";
  });
  expect_error("eval --config qwen3_debugmodel --training.seq_len 16 --model.hf_assets_path " + d,
               "the model (" + d + "/config.json) needs");
  expect_error(
      "check-kernel --config qwen3_debugmodel_moe --training.seq_len 16 "
      "--model.num_experts 1000000",
      "check-kernel needs");
}

// config.json a directory: basic_filebuf::underflow (internal error); no model_type or
// architectures: loaded as Qwen3.
TEST(CliBadInput, ConfigJsonNotAFileOrNotQwen3) {
  std::string d = broken_hf_dir("dir_config", [](const std::string& dir) {
    std::filesystem::remove(dir + "/config.json");
    std::filesystem::create_directories(dir + "/config.json");
  });
  expect_error("eval --config qwen3_debugmodel --model.hf_assets_path " + d,
               d + "/config.json: not a regular file");
  d = broken_hf_dir("untyped", [](const std::string& dir) {
    std::ofstream(dir + "/config.json")
        << R"({"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 64})";
  });
  expect_error("config show --config qwen3_debugmodel --model.hf_assets_path " + d,
               "field 'model_type' is missing (and so is 'architectures')");
}

// A tokenizer.json id of 2e9 allocated until std::bad_alloc.
TEST(CliBadInput, AbsurdTokenizerId) {
  const std::string d = temp_dir() + "/huge_id_tok";
  std::filesystem::create_directories(d);
  {
    std::ifstream in(assets() + "/tokenizers/tiny-bpe-2k/tokenizer.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t v = text.find("\"vocab\"");
    ASSERT_NE(v, std::string::npos);
    const size_t brace = text.find('{', v);
    text.insert(brace + 1, "\"zzzz\": 2000000000, ");
    std::ofstream(d + "/tokenizer.json") << text;
  }
  expect_error("tokenize --tokenizer " + d + " --text hi", "id 2000000000 is out of range");
}

// NaN weights: eval printed "loss nan" and exited 0; train blamed the learning rate.
TEST(CliBadInput, NonFiniteWeights) {
  const std::string d = broken_hf_dir("nan_weights", [](const std::string& dir) {
    const std::string f = dir + "/model.safetensors";
    std::vector<titan::ckpt::WriteTensor> out;
    std::vector<std::vector<uint8_t>> bytes;
    {
      titan::ckpt::SafetensorsSet set = titan::ckpt::SafetensorsSet::open(f);
      for (const auto& name : set.names()) {
        const titan::ckpt::TensorView* t = set.find(name);
        bytes.emplace_back(t->data, t->data + t->nbytes);
        if (name == "model.norm.weight") {
          const float nan = std::nanf("");
          std::memcpy(bytes.back().data(), &nan, 4);
        }
        out.push_back({name, t->dtype, t->shape, nullptr});
      }
    }
    for (size_t i = 0; i < out.size(); ++i) out[i].data = bytes[i].data();
    titan::ckpt::write_file(f, out);
  });
  const std::string corpus = temp_dir() + "/nan_corpus.txt";
  std::ofstream(corpus) << "some text to evaluate on\nanother line of it\n";
  expect_error(
      "eval --config qwen3_debugmodel --training.seq_len 16 --eval.steps 1 "
      "--dataloader.dataset_path " +
          corpus + " --model.hf_assets_path " + d,
      "the loss is not finite (nan): the weights from model.hf_assets_path '" + d +
          "' hold 1 non-finite value(s) (the first in 'norm.weight'); check them",
      false);
  const Result r = titan(
      "train --config qwen3_debugmodel --training.steps 1 --training.seq_len 16 "
      "--training.local_batch_size 1 --metrics.peak_flops 1e11 --metrics.enable_jsonl false "
      "--dump_folder " +
      temp_dir() + "/nan_run --dataloader.dataset_path " + corpus + " --model.hf_assets_path " + d +
      " --checkpoint.initial_load_in_hf --checkpoint.initial_load_path " + d);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("titan: error: step 1: loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the initial weights from checkpoint.initial_load_path '" + d +
                       "' hold 1 non-finite value(s) (the first in 'norm.weight'); check them"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("optimizer.lr"), std::string::npos) << r.out;
}

// Silently ignored before: logits_out without tokens_path; a job file that is a directory,
// /dev/zero, or names another job file.
TEST(CliBadInput, IgnoredOptionsAreRefused) {
  expect_error("eval --config qwen3_debugmodel --eval.logits_out /tmp/x.safetensors",
               "eval.logits_out needs eval.tokens_path");
  const std::string d = temp_dir();
  expect_error("config show --config qwen3_debugmodel --job.config_file " + d,
               "--job.config_file '" + d + "' is not a regular file");
  expect_error("config show --config qwen3_debugmodel --job.config_file /dev/zero",
               "--job.config_file '/dev/zero' is not a regular file");
  const std::string outer = d + "/outer_job.toml";
  std::ofstream(outer) << "[job]\nconfig_file = \"other.toml\"\n";
  expect_error("config show --config qwen3_debugmodel --job.config_file " + outer,
               outer + ":2: job.config_file inside a job file is not applied");
}

// Misleading messages before: a second --config ("did you mean --model.dim?"), global batch 0
// ("must be a multiple"), a train example for eval, an unhelpful check-kernel hint.
TEST(CliBadInput, MessagesSayWhatIsWrong) {
  expect_error("config show --config qwen3_debugmodel --config qwen3_0_6b",
               "--config given twice ('qwen3_debugmodel' and 'qwen3_0_6b')");
  expect_error("train --config qwen3_debugmodel --training.global_batch_size 0",
               "training.global_batch_size must be positive (or -1");
  expect_error("eval --model.hf_assets_path x",
               "--config is required, for example: titan eval --config qwen3_debugmodel "
               "--model.hf_assets_path DIR");
  expect_error("check-kernel", "for example: titan check-kernel --config");
  expect_error("config show", "for example: titan config show --config qwen3_debugmodel");
  const Result r = titan(
      "check-kernel --config qwen3_debugmodel --model.n_layers 1 "
      "--training.seq_len 16 --override.imports " +
      std::string(TITAN_PLUGIN_DIR) + "/libtitan_token_experts.so");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("libtitan_token_experts.so' replaced no RoPE or grouped-experts kernel"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("pass --override.imports"), std::string::npos) << r.out;
}

// training.device: an unknown device; cuda where it cannot run (no CUDA build, no GPU: CUDA's
// reason), and with a GPU a plugin op without a CUDA kernel, one line each, exit 1.
TEST(CliBadInput, DeviceCudaSaysWhyNot) {
  expect_error("train --config qwen3_debugmodel --training.device tpu",
               "training.device 'tpu' is not a known device; use cpu or cuda");
  std::string why;
  const titan::ops::Device& cuda = titan::ops::device("cuda");
  if (cuda.usable(&why)) {
    expect_error("train --config qwen3_debugmodel_moe --training.device cuda --override.imports " +
                     std::string(TITAN_PLUGIN_DIR) + "/libtitan_token_experts.so",
                 "'token_experts' is registered for cuda/");
    return;
  }
  const Result r = titan("train --config qwen3_debugmodel --training.device cuda");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("titan: error: training.device cuda: "), std::string::npos) << r.out;
  if (why.find("built without CUDA") != std::string::npos)
    EXPECT_NE(r.out.find("built without CUDA"), std::string::npos) << r.out;
  else
    EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
  expect_error("check-kernel --config qwen3_debugmodel --training.device cuda",
               "check-kernel --training.device cuda: ");
}

// A .txt dataset_path under the default dataset was split at '%' lines (fortunes records); a
// .json array of records was refused.
TEST(CliBadInput, DatasetPathIsReadByItsExtension) {
  const std::string d = temp_dir();
  std::ofstream(d + "/percent.txt") << "first line\n%\nsecond line\nthird line\n";
  Result r = titan(tiny_train(d + "/txt_run") + " --dataloader.dataset_path " + d + "/percent.txt");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dataloader: 4 documents in 1 file(s)"), std::string::npos) << r.out;
  std::ofstream(d + "/records.json")
      << R"([{"text": "a record"}, "a string record", {"text": "x"}])";
  r = titan(tiny_train(d + "/json_run") + " --dataloader.dataset_path " + d + "/records.json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dataloader: 3 documents in 1 file(s)"), std::string::npos) << r.out;
}

}  // namespace
