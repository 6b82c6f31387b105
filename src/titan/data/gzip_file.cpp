#include "titan/data/gzip_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "titan/core/error.h"
#include "titan/core/file_io.h"

namespace titan::data {
namespace {

constexpr size_t kChunk = size_t{1} << 16;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

FilePtr open_gzip(const std::string& path) {
  io::check_input_file(path, "dataset file");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  check(f != nullptr, "cannot read dataset file '" + path + "': " + io::errno_message(errno));
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f.get());
  check(got == 2 && magic[0] == 0x1f && magic[1] == 0x8b,
        path +
            ": not a gzip file (its name ends in .gz but it does not start with gzip's magic "
            "bytes 1f 8b); rename it or compress it with gzip");
  std::rewind(f.get());
  return f;
}

[[noreturn]] void corrupt(const std::string& path, const z_stream& s) {
  throw Error(path + ": corrupt gzip data (" + (s.msg ? s.msg : "zlib error") +
              "); check it with 'gzip -t' and fetch it again");
}

[[noreturn]] void truncated(const std::string& path) {
  throw Error(path +
              ": the gzip data ends early (a truncated file); check it with 'gzip -t' and "
              "fetch it again");
}

// Refills s.next_in from f when empty; false at the end of the file.
bool refill(std::FILE* f, const std::string& path, std::vector<unsigned char>* buf, z_stream* s) {
  if (s->avail_in > 0) return true;
  const size_t got = std::fread(buf->data(), 1, buf->size(), f);
  check(!std::ferror(f), "cannot read dataset file '" + path + "': " + io::errno_message(errno));
  s->next_in = buf->data();
  s->avail_in = static_cast<uInt>(got);
  return got > 0;
}

}  // namespace

bool is_gzip_name(const std::string& path) {
  if (path.size() < 3) return false;
  std::string ext = path.substr(path.size() - 3);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".gz";
}

GzipIndex scan_gzip(const std::string& path, uint64_t span,
                    const std::function<void(std::string_view)>& piece) {
  FilePtr f = open_gzip(path);
  GzipIndex idx;
  z_stream s{};
  check(inflateInit2(&s, 15 + 16) == Z_OK, "zlib: cannot start inflating " + path);
  std::unique_ptr<z_stream, int (*)(z_streamp)> guard(&s, inflateEnd);
  std::vector<unsigned char> in(kChunk);
  std::string window(GzipIndex::kWindow, '\0');
  uint64_t total_in = 0, total_out = 0, last = 0;
  int ret = Z_OK;
  for (;;) {
    const bool more = refill(f.get(), path, &in, &s);
    if (ret == Z_STREAM_END) {
      if (!more) break;
      inflateReset(&s);  // another member follows
    }
    if (s.avail_out == 0) {
      s.next_out = reinterpret_cast<Bytef*>(window.data());
      s.avail_out = GzipIndex::kWindow;
    }
    const char* from = reinterpret_cast<const char*>(s.next_out);
    total_in += s.avail_in;
    total_out += s.avail_out;
    ret = inflate(&s, Z_BLOCK);
    total_in -= s.avail_in;
    total_out -= s.avail_out;
    if (ret == Z_NEED_DICT || ret == Z_DATA_ERROR || ret == Z_MEM_ERROR) corrupt(path, s);
    if (ret == Z_BUF_ERROR && !more) truncated(path);  // no input left and no progress
    piece(std::string_view(from,
                           static_cast<size_t>(reinterpret_cast<const char*>(s.next_out) - from)));
    // A block boundary (bit 128) that is not after the last block (bit 64): a place to start.
    if (ret != Z_STREAM_END && (s.data_type & 128) && !(s.data_type & 64) &&
        (idx.points.empty() || total_out - last > span)) {
      idx.points.push_back({total_in, total_out, s.data_type & 7});
      // The window in output order: its older part after the write position, then the newer.
      const size_t left = s.avail_out;
      idx.windows.append(window, GzipIndex::kWindow - left, left);
      idx.windows.append(window, 0, GzipIndex::kWindow - left);
      last = total_out;
    }
  }
  check(!idx.points.empty(), path + ": holds no deflate data; check it with 'gzip -t'");
  idx.size = total_out;
  return idx;
}

std::string read_gzip(const std::string& path) {
  std::string text;
  scan_gzip(path, UINT64_MAX, [&](std::string_view p) { text.append(p); });
  return text;
}

std::string read_gzip_head(const std::string& path, size_t n) {
  open_gzip(path);  // the checks and messages of the other readers
  gzFile g = gzopen(path.c_str(), "rb");
  check(g != nullptr, "cannot read dataset file '" + path + "'");
  std::string head(n, '\0');
  const int got = gzread(g, head.data(), static_cast<unsigned>(n));
  int err = Z_OK;
  const char* msg = got < 0 ? gzerror(g, &err) : nullptr;
  const std::string why = msg ? msg : "";
  gzclose(g);
  check(got >= 0, path + ": corrupt gzip data (" + why + "); check it with 'gzip -t'");
  head.resize(static_cast<size_t>(got));
  return head;
}

struct GzipRanges::Stream {
  FilePtr f;
  z_stream z{};
  bool live = false;  // z initialized
  bool raw = true;    // inflating a member's deflate data without its gzip wrapper
  bool member_end = false;
  uint64_t out = 0;
  std::vector<unsigned char> in = std::vector<unsigned char>(kChunk);
  ~Stream() {
    if (live) inflateEnd(&z);
  }
};

GzipRanges::GzipRanges(std::string path, std::shared_ptr<const GzipIndex> index)
    : path_(std::move(path)), index_(std::move(index)) {}

GzipRanges::~GzipRanges() = default;

void GzipRanges::start_at(size_t k) {
  const GzipPoint& p = index_->points[k];
  if (!s_) {
    s_ = std::make_unique<Stream>();
    s_->f = open_gzip(path_);
  }
  Stream& s = *s_;
  if (s.live) inflateEnd(&s.z);
  s.z = z_stream{};
  check(inflateInit2(&s.z, -15) == Z_OK, "zlib: cannot start inflating " + path_);
  s.live = true;
  s.raw = true;
  s.member_end = false;
  const auto at = static_cast<off_t>(p.in) - (p.bits ? 1 : 0);
  check(fseeko(s.f.get(), at, SEEK_SET) == 0,
        "cannot seek in dataset file '" + path_ + "': " + io::errno_message(errno));
  if (p.bits) {
    const int c = std::getc(s.f.get());
    if (c == EOF) truncated(path_);
    inflatePrime(&s.z, p.bits, c >> (8 - p.bits));
  }
  inflateSetDictionary(
      &s.z, reinterpret_cast<const Bytef*>(index_->windows.data()) + k * GzipIndex::kWindow,
      GzipIndex::kWindow);
  s.out = p.out;
}

namespace {

// Inflates exactly n bytes into dst, crossing into following members.
void produce(const std::string& path, std::FILE* f, std::vector<unsigned char>* in, z_stream* z,
             bool* raw, bool* member_end, char* dst, size_t n) {
  z->next_out = reinterpret_cast<Bytef*>(dst);
  z->avail_out = static_cast<uInt>(n);
  while (z->avail_out > 0) {
    const bool more = refill(f, path, in, z);
    if (*member_end) {
      if (*raw) {  // skip the member's 8-byte trailer (CRC-32, size) that raw inflate leaves
        if (!more) truncated(path);
        for (int k = 0; k < 8; ++k) {
          if (!refill(f, path, in, z)) truncated(path);
          ++z->next_in;
          --z->avail_in;
        }
        if (!refill(f, path, in, z)) truncated(path);
        check(inflateReset2(z, 15 + 16) == Z_OK, "zlib: cannot restart inflating " + path);
        *raw = false;
      } else {
        inflateReset(z);
      }
      *member_end = false;
    }
    const int ret = inflate(z, Z_NO_FLUSH);
    if (ret == Z_NEED_DICT || ret == Z_DATA_ERROR || ret == Z_MEM_ERROR) corrupt(path, *z);
    if (ret == Z_BUF_ERROR && !more) truncated(path);
    if (ret == Z_STREAM_END) *member_end = true;
  }
}

}  // namespace

void GzipRanges::skip_to(uint64_t offset) {
  std::string sink(kChunk, '\0');
  while (s_->out < offset) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, offset - s_->out));
    produce(path_, s_->f.get(), &s_->in, &s_->z, &s_->raw, &s_->member_end, sink.data(), n);
    s_->out += n;
  }
}

void GzipRanges::read(uint64_t offset, uint64_t n, std::string* out) {
  check(offset + n <= index_->size, path_ + ": a read past the end of the uncompressed data (" +
                                        std::to_string(offset + n) + " > " +
                                        std::to_string(index_->size) +
                                        " bytes); the file changed since it was indexed");
  const auto& pts = index_->points;
  const size_t k = static_cast<size_t>(
      std::upper_bound(pts.begin(), pts.end(), offset,
                       [](uint64_t v, const GzipPoint& p) { return v < p.out; }) -
      pts.begin() - 1);
  // Read on from the live stream when no access point lies between it and the range.
  if (!s_ || !s_->live || s_->out > offset || pts[k].out > s_->out) start_at(k);
  skip_to(offset);
  out->resize(static_cast<size_t>(n));
  produce(path_, s_->f.get(), &s_->in, &s_->z, &s_->raw, &s_->member_end, out->data(),
          static_cast<size_t>(n));
  s_->out += n;
}

}  // namespace titan::data
