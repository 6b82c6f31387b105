// A full disk: titan writing metrics (TensorBoard aside: see its test), checkpoints, the final export and `titan tokenize` output
// to a small tmpfs filled up to a chosen point. Each write that does not fit fails with one
// "titan: error:" line naming the file and the reason, a non-zero exit, and leaves no
// half-written file: no temporary names, metrics.jsonl whole lines only, every step folder
// complete (its checksums verify), no partial shard. Skipped where mounting is not allowed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "test_util.h"
#include "titan/checkpoint/checksums.h"

namespace {
namespace fs = std::filesystem;

using Result = ::titan::testing::CliResult;
Result titan(const std::string& args) { return ::titan::testing::run_titan(args); }

class FullDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = titan::testing::fresh_temp_dir("fulldisk");
    mnt_ = root_ + "/mnt";
    fs::create_directories(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=4m") != 0)
      GTEST_SKIP() << "cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                   << std::strerror(errno);
    mounted_ = true;
    corpus_ = root_ + "/corpus.txt";
    std::ofstream o(corpus_);
    for (int i = 0; i < 40; ++i) o << "line " << i << " of the full disk corpus, some words\n";
  }
  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // An empty tmpfs with `free_bytes` left (a filler file takes the rest).
  void fill(uint64_t free_bytes) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(mnt_)) fs::remove_all(e.path(), ec);
    struct statvfs st;
    ASSERT_EQ(::statvfs(mnt_.c_str(), &st), 0);
    const uint64_t avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    ASSERT_GE(avail, free_bytes);
    if (avail == free_bytes) return;
    const int fd = ::open((mnt_ + "/.filler").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(avail - free_bytes)), 0);
    ::close(fd);
  }
  std::string train(const std::string& extra) const {
    return "train --config qwen3_debugmodel --model.n_layers 2 --model.dim 32 --model.n_heads 4 "
           "--model.n_kv_heads 2 --model.head_dim 16 --model.hidden_dim 64 "
           "--model.vocab_size 260 --training.steps 4 --training.seq_len 32 "
           "--training.local_batch_size 2 --metrics.log_freq 1 --metrics.peak_flops 1e11 "
           "--dataloader.dataset text --dataloader.dataset_path " +
           corpus_ + " --dump_folder " + mnt_ + "/out " + extra;
  }
  // The run failed with one error line holding each needle, and left nothing half-written.
  void expect_clean_failure(const Result& r, const std::vector<std::string>& needles) {
    EXPECT_EQ(r.code, 1) << r.out;
    const size_t at = r.out.find("titan: error: ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_EQ(r.out.find("titan: error: ", at + 1), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\n', at), r.out.size() - 1) << "the error is the last line:\n" << r.out;
    for (const auto& n : needles) EXPECT_NE(line.find(n), std::string::npos) << n << "\n" << line;
    expect_nothing_half_written();
  }
  void expect_nothing_half_written() {
    for (const auto& e : fs::recursive_directory_iterator(mnt_)) {
      const std::string n = e.path().filename().string();
      EXPECT_EQ(n.find(".tmp"), std::string::npos) << e.path();
      EXPECT_EQ(n.find(".old-"), std::string::npos) << e.path();
      if (n == "metrics.jsonl") {
        std::ifstream f(e.path());
        const std::string text((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
        EXPECT_TRUE(text.empty() || text.back() == '\n') << text;
        std::istringstream lines(text);
        for (std::string l; std::getline(lines, l);)
          EXPECT_FALSE(nlohmann::json::parse(l, nullptr, false).is_discarded()) << l;
      }
      if (n.rfind("step-", 0) == 0 && e.is_directory()) {
        EXPECT_TRUE(titan::ckpt::verify_checksums(e.path().string())) << e.path();
      }
    }
  }
  std::string root_, mnt_, corpus_;
  bool mounted_ = false;
};

TEST_F(FullDisk, Metrics) {
  fill(0);
  Result r = titan(train(""));
  expect_clean_failure(
      r, {mnt_ + "/out/metrics.jsonl", "the metrics record of step 1", "No space left on device"});
  EXPECT_FALSE(fs::exists(mnt_ + "/out/metrics.jsonl")) << "an empty file was left";
}

// TensorBoard is an observer: when its file no longer fits, the run says so once and goes on
// (metrics.jsonl and the checkpoints still matter).
TEST_F(FullDisk, TensorBoardFullKeepsTraining) {
  // The TensorBoard folder on its own 8 KiB tmpfs (its 30 steps need about 20 KiB); the rest has
  // room.
  const std::string tb = mnt_ + "/out/tb";
  fs::create_directories(tb);
  ASSERT_EQ(::mount("tmpfs", tb.c_str(), "tmpfs", 0, "size=8k"), 0) << std::strerror(errno);
  Result r = titan(train("--metrics.enable_tensorboard --training.steps 30"));
  ::umount2(tb.c_str(), MNT_DETACH);
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string off = "TensorBoard is off for the rest of this run";
  const size_t at = r.out.find(off);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(off, at + 1), std::string::npos) << "said once:\n" << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  std::ifstream f(mnt_ + "/out/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(f, l);) ++lines;
  EXPECT_EQ(lines, 30);
}

TEST_F(FullDisk, Checkpoint) {
  // Room for the metrics and model.safetensors (135 kB), not optimizer.safetensors (270 kB).
  fill(256 << 10);
  Result r = titan(train("--checkpoint.enable --checkpoint.interval 2"));
  expect_clean_failure(r, {"cannot save checkpoint " + mnt_ + "/out/checkpoint/step-2",
                           "optimizer.safetensors: write failed (No space left on device)"});
  EXPECT_FALSE(fs::exists(mnt_ + "/out/checkpoint/step-2"));
}

TEST_F(FullDisk, Export) {
  for (const std::string hf : {"", "--checkpoint.last_save_in_hf"}) {
    fill(64 << 10);  // the metrics fit, the exported model does not
    Result r = titan(train("--checkpoint.enable --checkpoint.interval 100 " + hf));
    expect_clean_failure(r, {"cannot export the model to " + mnt_ + "/out/checkpoint/step-4",
                             "No space left on device"});
    EXPECT_FALSE(fs::exists(mnt_ + "/out/checkpoint/step-4"));
  }
}

TEST_F(FullDisk, TokenizeOutput) {
  fill(0);
  Result r =
      titan("tokenize --tokenizer byte --input " + corpus_ + " --output " + mnt_ + "/corpus.bin");
  expect_clean_failure(r, {mnt_ + "/corpus.bin", "No space left on device"});
  EXPECT_FALSE(fs::exists(mnt_ + "/corpus.bin"));
}

// Free space from none to enough, in steps: every run either completes (its checkpoints whole)
// or fails cleanly, whichever file the disk fills in.
TEST_F(FullDisk, EveryFillLevelFailsCleanlyOrSucceeds) {
  int failed = 0, passed = 0;
  for (uint64_t kb : {0, 4, 100, 140, 200, 400, 560, 700, 900, 1200, 1600, 2400}) {
    SCOPED_TRACE(std::to_string(kb) + " kB free");
    fill(kb << 10);
    Result r =
        titan(train("--checkpoint.enable --checkpoint.interval 2 "
                    "--checkpoint.last_save_in_hf"));
    if (r.code == 0) {
      ++passed;
      expect_nothing_half_written();
    } else {
      ++failed;
      expect_clean_failure(r, {mnt_ + "/out/", "No space left on device"});
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(passed, 0);
}

}  // namespace
