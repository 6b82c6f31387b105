// TensorBoard event files (what torch.utils.tensorboard's SummaryWriter writes, and TensorBoard
// and its EventAccumulator read): a file events.out.tfevents.<seconds>.<host>.<pid>.0 of TFRecord
// records, each
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked
//   CRC32C of data,   masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8,
// whose data is a serialized tensorflow.Event: the first {wall_time, file_version
// "brain.Event:2"}, then one per scalar {wall_time, step, summary {value {tag, simple_value}}}.
//
// The two messages are encoded here, not with libprotobuf: they use four wire primitives
// (varint, fixed64, fixed32, length-delimited), and libprotobuf would need TensorBoard's .proto
// files (not packaged by Debian) compiled by protoc in the build. CRC32C is the CPU's crc32
// instruction (SSE4.2) where present, else a table; Debian 12 packages no C/C++ CRC32C library.
// tests/train/tensorboard_test.cpp reads the files back with a reader of this format and, with
// the tools venv, with the real tensorboard package.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace titan::train {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

class TensorBoardWriter {
 public:
  // Creates dir (and its parents) and a new event file in it; throws titan::Error naming the
  // folder when either fails.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar summary event; written through to the file (flushed), so a killed run keeps
  // every logged step. Throws titan::Error naming the file when a write fails.
  void scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void record(std::string_view data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace titan::train
