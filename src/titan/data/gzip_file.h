// Reading gzip files (RFC 1952, as C4's c4-train.*.json.gz shards; several members back to back,
// as `cat a.gz b.gz` makes, read as one stream) through zlib without unpacking them to disk:
//   - read_gzip: the whole uncompressed text (small files);
//   - scan_gzip: one pass over the uncompressed bytes, handed out in pieces, that also records
//     access points (zlib's zran method: at a deflate block boundary, every `span` uncompressed
//     bytes, the compressed position, its bit offset and the 32 KiB of output before it);
//   - GzipRanges: any uncompressed byte range [offset, offset + n), inflating from the nearest
//     access point before it (at most `span` bytes to skip) or, reading on from the last range,
//     from where that one ended (a sequential reader inflates every byte once).
// Errors (not gzip, corrupt, truncated) are titan::Error naming the file and what to do.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// Whether the file name ends in ".gz" (any case).
bool is_gzip_name(const std::string& path);

// The whole uncompressed content of a gzip file.
std::string read_gzip(const std::string& path);
// Its first n uncompressed bytes (fewer when it is shorter).
std::string read_gzip_head(const std::string& path, size_t n);

// A place in the compressed stream where inflating can start without what came before it.
struct GzipPoint {
  uint64_t in = 0;   // compressed bytes before the point (the byte holding `bits` is the last)
  uint64_t out = 0;  // uncompressed bytes before it
  int32_t bits = 0;  // bits of the byte before `in` that belong to the next block (0..7)
};

// The access points of one file and, per point, the 32 KiB window that precedes it (the deflate
// dictionary: back-references reach at most that far).
struct GzipIndex {
  static constexpr size_t kWindow = 32768;
  std::vector<GzipPoint> points;
  std::string windows;  // points.size() × kWindow bytes
  uint64_t size = 0;    // uncompressed bytes in all
};

// Inflates the whole file once, calling piece(bytes) for the uncompressed bytes in order, and
// returns the access points, at least one and then one at the first block boundary after each
// `span` uncompressed bytes.
GzipIndex scan_gzip(const std::string& path, uint64_t span,
                    const std::function<void(std::string_view)>& piece);

// Random access to the uncompressed bytes of one gzip file through its index. Not thread safe.
class GzipRanges {
 public:
  GzipRanges(std::string path, std::shared_ptr<const GzipIndex> index);
  ~GzipRanges();
  GzipRanges(const GzipRanges&) = delete;
  GzipRanges& operator=(const GzipRanges&) = delete;
  // Replaces *out with the uncompressed bytes [offset, offset + n).
  void read(uint64_t offset, uint64_t n, std::string* out);

 private:
  struct Stream;
  void start_at(size_t point);
  void skip_to(uint64_t offset);
  std::string path_;
  std::shared_ptr<const GzipIndex> index_;
  std::unique_ptr<Stream> s_;  // the live inflate stream, positioned at s_->out
};

}  // namespace titan::data
