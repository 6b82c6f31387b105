#include "titan/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/core/file_io.h"

namespace titan::train {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif

uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

// Protocol buffer wire format (tag = field << 3 | wire type).
void varint(std::string& o, uint64_t v) {
  for (; v >= 0x80; v >>= 7) o.push_back(static_cast<char>((v & 0x7f) | 0x80));
  o.push_back(static_cast<char>(v));
}
void fixed(std::string& o, int field, int wire, const void* p, size_t n) {
  varint(o, static_cast<uint64_t>(field << 3 | wire));
  o.append(static_cast<const char*>(p), n);
}
void bytes(std::string& o, int field, std::string_view s) {
  varint(o, static_cast<uint64_t>(field << 3 | 2));
  varint(o, s.size());
  o.append(s);
}
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc32c_hw(p, n, c);
#endif
  static const std::array<uint32_t, 256> t = crc_table();
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  check(!ec, "cannot create the TensorBoard folder " + dir + " (" + ec.message() +
                 "); check dump_folder and metrics.save_tb_folder");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
          "." + host + "." + std::to_string(getpid()) + ".0";
  f_ = std::fopen(path_.c_str(), "wb");
  check(f_ != nullptr, "cannot create " + path_ + " (" + io::errno_message(errno) +
                           "); check metrics.save_tb_folder");
  std::string e;
  const double t = now_seconds();
  fixed(e, 1, 1, &t, 8);
  bytes(e, 3, "brain.Event:2");
  record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v, summary, e;
  bytes(v, 1, tag);
  const auto f = static_cast<float>(value);
  fixed(v, 2, 5, &f, 4);
  bytes(summary, 1, v);
  const double t = now_seconds();
  fixed(e, 1, 1, &t, 8);
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<uint64_t>(step));
  bytes(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(std::string_view data) {
  const uint64_t n = data.size();
  char head[12];
  std::memcpy(head, &n, 8);
  const uint32_t hc = masked(crc32c(head, 8));
  std::memcpy(head + 8, &hc, 4);
  const uint32_t dc = masked(crc32c(data.data(), data.size()));
  const bool ok = std::fwrite(head, 1, 12, f_) == 12 &&
                  std::fwrite(data.data(), 1, data.size(), f_) == data.size() &&
                  std::fwrite(&dc, 1, 4, f_) == 4 && std::fflush(f_) == 0;
  check(ok, "cannot write " + path_ + " (" + io::errno_message(errno) + ")");
}

}  // namespace titan::train
