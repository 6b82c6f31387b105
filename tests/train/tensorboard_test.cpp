// TensorBoard event files: CRC32C against its published check values; a file written by
// TensorBoardWriter read back by a reader of the TFRecord framing (lengths, masked CRCs) and the
// Event/Summary wire format, every scalar found with its tag, step and value; the same file read
// by the real tensorboard package's EventAccumulator (tools venv; skipped without it); a training
// run with metrics.enable_tensorboard writes torchtitan's tags; an unwritable folder is one error.
#include "titan/train/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::train {
namespace {

namespace fs = std::filesystem;

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);  // continued
}

struct Scalar {
  std::string tag;
  int64_t step;
  float value;
};

uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Fields of one message: field number → (wire type, raw bytes or varint value as bytes).
std::multimap<int, std::string> fields(const std::string& m) {
  std::multimap<int, std::string> r;
  for (size_t i = 0; i < m.size();) {
    const uint64_t key = read_varint(m, i);
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 0) {
      const uint64_t v = read_varint(m, i);
      r.emplace(field, std::string(reinterpret_cast<const char*>(&v), 8));
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      r.emplace(field, m.substr(i, n));
      i += n;
    } else {
      EXPECT_EQ(wire, 2);
      const uint64_t n = read_varint(m, i);
      r.emplace(field, m.substr(i, n));
      i += n;
    }
  }
  return r;
}

uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

// Every record's framing and CRCs checked; returns the scalars and the file_version.
std::vector<Scalar> read_events(const std::string& path, std::string* version) {
  std::ifstream f(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<Scalar> out;
  for (size_t i = 0; i < s.size();) {
    uint64_t n;
    uint32_t hc, dc;
    EXPECT_LE(i + 12, s.size());
    std::memcpy(&n, s.data() + i, 8);
    std::memcpy(&hc, s.data() + i + 8, 4);
    EXPECT_EQ(hc, masked(crc32c(s.data() + i, 8)));
    const std::string data = s.substr(i + 12, n);
    std::memcpy(&dc, s.data() + i + 12 + n, 4);
    EXPECT_EQ(dc, masked(crc32c(data.data(), data.size())));
    i += 12 + n + 4;
    const auto e = fields(data);
    EXPECT_EQ(e.count(1), 1u);  // wall_time
    if (e.count(3)) *version = e.find(3)->second;
    if (!e.count(5)) continue;
    int64_t step = 0;
    std::memcpy(&step, e.find(2)->second.data(), 8);
    const auto summary = fields(e.find(5)->second);
    for (auto [it, end] = summary.equal_range(1); it != end; ++it) {
      const auto v = fields(it->second);
      float x;
      std::memcpy(&x, v.find(2)->second.data(), 4);
      out.push_back({v.find(1)->second, step, x});
    }
  }
  return out;
}

std::string only_event_file(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? "" : files[0];
}

TEST(TensorBoard, ScalarsReadBack) {
  const std::string dir = testing::fresh_temp_dir("tb_scalars") + "/tb";
  {
    TensorBoardWriter w(dir);
    w.scalar("loss_metrics/global_avg_loss", 7.5, 1);
    w.scalar("grad_norm", 0.125, 1);
    w.scalar("loss_metrics/global_avg_loss", 6.25, 300);
  }
  std::string version;
  const auto s = read_events(only_event_file(dir), &version);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].tag, "loss_metrics/global_avg_loss");
  EXPECT_EQ(s[0].value, 7.5f);
  EXPECT_EQ(s[1].tag, "grad_norm");
  EXPECT_EQ(s[2].step, 300);
  EXPECT_EQ(s[2].value, 6.25f);

  const std::string py = std::string(TITAN_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py) ||
      std::system((py + " -c 'import tensorboard' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "no tools venv with tensorboard (tools/setup_venv.sh): skipped its reader";
  const std::string cmd =
      py +
      " -c \"from tensorboard.backend.event_processing.event_accumulator import "
      "EventAccumulator as E; a=E('" +
      dir +
      "'); a.Reload(); "
      "print([(x.step, x.value) for x in a.Scalars('loss_metrics/global_avg_loss')], "
      "[(x.step, x.value) for x in a.Scalars('grad_norm')])\" 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0) << out;
  EXPECT_EQ(out, "[(1, 7.5), (300, 6.25)] [(1, 0.125)]\n");
}

TEST(TensorBoard, UnwritableFolderIsOneError) {
  const std::string dir = testing::fresh_temp_dir("tb_bad");
  std::ofstream(dir + "/file") << "x";
  try {
    TensorBoardWriter w(dir + "/file/tb");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TensorBoard folder"), std::string::npos) << e.what();
  }
}

TEST(TensorBoard, TrainingWritesTorchtitanTags) {
  const std::string dir = testing::fresh_temp_dir("tb_train");
  const std::string cmd = std::string(TITAN_BINARY) +
                          " train --config qwen3_debugmodel --model.n_layers 1 --model.dim 32 "
                          "--model.n_heads 2 --model.n_kv_heads 1 --model.head_dim 16 "
                          "--model.hidden_dim 64 --model.vocab_size 260 --training.seq_len 32 "
                          "--training.local_batch_size 2 --training.steps 4 --metrics.log_freq 2 "
                          "--metrics.enable_tensorboard --metrics.peak_flops 1e12 --dump_folder " +
                          dir + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string version;
  const auto s = read_events(only_event_file(dir + "/tb"), &version);
  std::map<std::string, std::vector<int64_t>> steps;
  for (const auto& x : s) steps[x.tag].push_back(x.step);
  for (const char* tag :
       {"loss_metrics/global_avg_loss", "grad_norm", "lr/AdamW", "throughput(tps)", "tflops",
        "mfu(%)", "memory/max_reserved(GiB)", "n_tokens_seen", "time_metrics/end_to_end(s)"})
    EXPECT_EQ(steps[tag], (std::vector<int64_t>{1, 2, 4})) << tag;
}

}  // namespace
}  // namespace titan::train
