#include "titan/data/text_corpus.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/data/gzip_file.h"
#include "titan/data/hf_tokenizer.h"

namespace titan::data {
namespace {
namespace fs = std::filesystem;

constexpr char kMagic[8] = {'T', 'I', 'T', 'A', 'N', 'I', 'D', 'X'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kGzipSpan = uint64_t{4} << 20;  // an access point per 4 MiB of text
constexpr size_t kReadChunk = size_t{1} << 20;

enum Format : uint32_t { kText = 0, kFortunes = 1, kJsonl = 2 };

// Where one file's documents are.
struct FileIndex {
  std::string path;
  Format format = kText;
  uint64_t file_size = 0;
  int64_t mtime_ns = 0;
  // Each document's first byte (uncompressed, for gzip) and length: in `built` while indexing,
  // then in the saved index file, memory-mapped (`mapped`), so that the ranks of a host share it.
  std::vector<uint64_t> built_offset;
  std::vector<uint32_t> built_length;
  std::shared_ptr<const void> mapped;
  const uint64_t* offset = nullptr;
  const uint32_t* length = nullptr;
  size_t count = 0;
  FileIndex() = default;
  FileIndex(FileIndex&&) = default;  // the views stay valid: a moved vector keeps its buffer
  FileIndex& operator=(FileIndex&&) = default;
  FileIndex(const FileIndex&) = delete;
  void use_built() {
    offset = built_offset.data();
    length = built_length.data();
    count = built_offset.size();
  }
  std::vector<std::string> held;  // a .json file holding one array: its documents, in memory
  std::shared_ptr<GzipIndex> gzip;
  SourceStats stats;
};

void add_stats(const SourceStats& f, SourceStats* st) {
  st->files += f.files;
  st->documents += f.documents;
  st->empty += f.empty;
  if (f.malformed > 0 && st->malformed == 0) st->first_malformed = f.first_malformed;
  if (f.missing_field > 0 && st->missing_field == 0) st->first_missing = f.first_missing;
  if (f.utf8_replaced > 0 && st->utf8_replaced == 0) st->first_utf8 = f.first_utf8;
  st->malformed += f.malformed;
  st->missing_field += f.missing_field;
  st->utf8_replaced += f.utf8_replaced;
}

// Splits a stream of pieces into lines (without their '\n'; a last line without one counts, as
// std::getline has it), calling line(text, offset of its first byte, line number from 1).
class LineSplitter {
 public:
  template <class Fn>
  void feed(std::string_view piece, Fn&& line) {
    size_t i = 0;
    for (size_t nl; (nl = piece.find('\n', i)) != std::string_view::npos; i = nl + 1) {
      if (partial_.empty()) {
        line(piece.substr(i, nl - i), pos_ + i, ++lineno_);
      } else {
        partial_.append(piece.substr(i, nl - i));
        line(std::string_view(partial_), start_, ++lineno_);
        partial_.clear();
      }
      start_ = pos_ + nl + 1;
    }
    partial_.append(piece.substr(i));
    pos_ += piece.size();
  }
  template <class Fn>
  void finish(Fn&& line) {
    if (!partial_.empty()) line(std::string_view(partial_), start_, ++lineno_);
    partial_.clear();
  }
  uint64_t size() const { return pos_; }

 private:
  std::string partial_;
  uint64_t pos_ = 0, start_ = 0;
  int64_t lineno_ = 0;
};

// The first n bytes of a file (all of it when shorter).
std::string read_bytes(const std::string& path, size_t n) {
  io::check_input_file(path, "file");
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot read '" + path + "'");
  std::string s;
  char buf[65536];
  while (s.size() < n && in.read(buf, sizeof buf).gcount() > 0)
    s.append(buf, std::min(static_cast<size_t>(in.gcount()), n - s.size()));
  return s;
}

std::string where(const std::string& file, int64_t line) {
  return file + ":" + std::to_string(line);
}

// Counts (and, the first time, places) the invalid UTF-8 of one line; returns the line with it
// replaced, or empty when it is valid.
std::string replace_invalid(std::string_view line, const std::string& file, int64_t lineno,
                            SourceStats* st) {
  if (find_invalid_utf8(line) == std::string::npos) return {};
  if (st->utf8_replaced == 0) st->first_utf8 = where(file, lineno);
  int64_t n = 0;
  std::string r = HfTokenizer::sanitize_utf8(line, &n);
  st->utf8_replaced += n;
  return r;
}

void push_document(FileIndex* f, uint64_t offset, uint64_t length) {
  check(length <= UINT32_MAX, f->path + ": a document of " + std::to_string(length) +
                                  " bytes at byte " + std::to_string(offset) +
                                  "; documents are limited to 4 GiB");
  f->built_offset.push_back(offset);
  f->built_length.push_back(static_cast<uint32_t>(length));
}

// One pass over a file's bytes (inflated when gzip), recording its documents.
void scan_file(const SourceOptions& o, FileIndex* f) {
  SourceStats* st = &f->stats;
  st->files = 1;
  LineSplitter lines;
  std::string doc;  // a JSON line's document (only its presence is recorded)
  uint64_t record = 0;
  bool record_used = false;  // the fortunes record holds a non-blank line
  const auto on_line = [&](std::string_view line, uint64_t at, int64_t lineno) {
    switch (f->format) {
      case kText:
        if (!is_blank(line)) push_document(f, at, line.size());
        break;
      case kFortunes:
        if (line == "%") {
          if (record_used) push_document(f, record, at - record);
          record = at + line.size() + 1;
          record_used = false;
        } else {
          record_used = record_used || !is_blank(line);
        }
        break;
      case kJsonl: {
        if (is_blank(line)) break;
        std::string text = replace_invalid(line, f->path, lineno, st);
        if (text.empty()) text = line;
        parse_json_line(
            text, f->path, lineno, o, st,
            [&](const nlohmann::json& j, const std::string& w, const std::string& what) {
              if (json_document(j, w, what, o, false, st, &doc)) push_document(f, at, line.size());
            });
        return;
      }
    }
    replace_invalid(line, f->path, lineno, st);
  };
  const auto feed = [&](std::string_view piece) { lines.feed(piece, on_line); };
  if (is_gzip_name(f->path)) {
    f->gzip = std::make_shared<GzipIndex>(scan_gzip(f->path, kGzipSpan, feed));
  } else {
    io::check_input_file(f->path, "dataset file");
    const int fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd >= 0, "cannot read dataset file '" + f->path + "': " + io::errno_message(errno));
    std::string buf(kReadChunk, '\0');
    for (;;) {
      const ssize_t got = ::read(fd, buf.data(), buf.size());
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        const int e = errno;
        ::close(fd);
        check(got == 0, "cannot read dataset file '" + f->path + "': " + io::errno_message(e));
        break;
      }
      feed(std::string_view(buf.data(), static_cast<size_t>(got)));
    }
  }
  lines.finish(on_line);
  if (f->format == kFortunes && record_used) push_document(f, record, lines.size() - record);
  f->use_built();
  st->documents = static_cast<int64_t>(f->count);
}

// --- the index file ---------------------------------------------------------------------------

class Out {
 public:
  template <class T>
  void put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& v) {
    put(static_cast<uint32_t>(v.size()));
    s += v;
  }
  template <class T>
  void vec(const T* v, size_t n) {
    s.append(reinterpret_cast<const char*>(v), n * sizeof(T));
  }
  void align8() { s.append((8 - s.size() % 8) % 8, '\0'); }
  std::string s;
};

// Reads the fields of a mapped index file, each checked to lie inside it.
class In {
 public:
  In(const char* data, size_t size, size_t at) : p_(data), n_(size), at_(at) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str() {
    const uint32_t n = get<uint32_t>();
    return std::string(take(n), n);
  }
  // n values of T in place (the file keeps them 8-byte aligned).
  template <class T>
  const T* array(uint64_t n) {
    check(n <= (n_ - at_) / sizeof(T), "it ends early");
    return reinterpret_cast<const T*>(take(n * sizeof(T)));
  }
  const char* take(uint64_t n) {
    need(n);
    const char* v = p_ + at_;
    at_ += static_cast<size_t>(n);
    return v;
  }
  void align8() { take((8 - at_ % 8) % 8); }
  bool done() const { return at_ == n_; }

 private:
  void need(uint64_t n) const { check(n <= n_ - at_, "it ends early"); }
  const char* p_;
  size_t n_, at_;
};

std::string index_path(const std::string& dir, const std::string& file) {
  const std::string abs = io::absolute_path(file);
  uint64_t h = 1469598103934665603ULL;  // FNV-1a of the absolute path
  for (unsigned char c : abs) h = (h ^ c) * 1099511628211ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return dir + "/" + fs::path(file).filename().string() + "." + hex + ".idx";
}

void put_stats(Out* w, const SourceStats& s) {
  for (int64_t v : {s.documents, s.empty, s.malformed, s.missing_field, s.utf8_replaced}) w->put(v);
  for (const std::string* v : {&s.first_malformed, &s.first_missing, &s.first_utf8}) w->str(*v);
}

SourceStats get_stats(In* r) {
  SourceStats s;
  s.files = 1;
  for (int64_t* v : {&s.documents, &s.empty, &s.malformed, &s.missing_field, &s.utf8_replaced})
    *v = r->get<int64_t>();
  for (std::string* v : {&s.first_malformed, &s.first_missing, &s.first_utf8}) *v = r->str();
  return s;
}

// The header fields that must match for a saved index to be used.
void put_key(Out* w, const FileIndex& f, const SourceOptions& o) {
  w->vec(kMagic, 8);
  w->put(kVersion);
  w->put(static_cast<uint32_t>(f.format));
  w->put(f.file_size);
  w->put(f.mtime_ns);
  w->put(static_cast<uint8_t>(o.skip_malformed));
  w->str(o.text_field);
}

void save_index(const std::string& path, const FileIndex& f, const SourceOptions& o) {
  Out w;
  put_key(&w, f, o);
  put_stats(&w, f.stats);
  w.align8();
  w.put(static_cast<uint64_t>(f.count));
  w.vec(f.offset, f.count);
  w.vec(f.length, f.count);
  w.align8();
  if (f.gzip) {
    w.put(f.gzip->size);
    w.put(static_cast<uint64_t>(f.gzip->points.size()));
    for (const GzipPoint& p : f.gzip->points) {
      w.put(p.in);
      w.put(p.out);
      w.put(p.bits);
    }
    w.s += f.gzip->windows;
  }
  io::write_file_atomic(path, w.s);
}

// Reads a saved index into *f (whose path, format, size and time are set); false with *why when
// it was made for another file or options, or is damaged.
bool load_index(const std::string& path, const SourceOptions& o, FileIndex* f, std::string* why) {
  std::shared_ptr<const void> map;
  size_t size = 0;
  try {
    io::check_input_file(path, "dataset index");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd >= 0, "cannot open it: " + io::errno_message(errno));
    struct stat sb {};
    const bool ok = ::fstat(fd, &sb) == 0;
    size = ok ? static_cast<size_t>(sb.st_size) : 0;
    void* p = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    check(p != MAP_FAILED, "it is empty or cannot be mapped");
    map = std::shared_ptr<const void>(
        p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
  const char* data = static_cast<const char*>(map.get());
  Out key;
  put_key(&key, *f, o);
  if (size < key.s.size() || std::memcmp(data, key.s.data(), key.s.size()) != 0) {
    *why = "it was made for another version of the file or other dataloader options";
    return false;
  }
  try {
    In r(data, size, key.s.size());
    SourceStats st = get_stats(&r);
    r.align8();
    const uint64_t n = r.get<uint64_t>();
    const uint64_t* offset = r.array<uint64_t>(n);
    const uint32_t* length = r.array<uint32_t>(n);
    r.align8();
    std::shared_ptr<GzipIndex> gz;
    uint64_t limit = f->file_size;
    if (is_gzip_name(f->path)) {
      gz = std::make_shared<GzipIndex>();
      gz->size = limit = r.get<uint64_t>();
      const uint64_t m = r.get<uint64_t>();
      check(m >= 1 && m <= f->file_size, "its access points are out of range");
      for (uint64_t k = 0; k < m; ++k) {
        GzipPoint p;
        p.in = r.get<uint64_t>();
        p.out = r.get<uint64_t>();
        p.bits = r.get<int32_t>();
        check(p.in <= f->file_size && p.out <= gz->size && p.bits >= 0 && p.bits < 8 &&
                  (k == 0 || p.out > gz->points.back().out),
              "its access points are out of range");
        gz->points.push_back(p);
      }
      gz->windows.assign(r.take(m * GzipIndex::kWindow), m * GzipIndex::kWindow);
    }
    check(r.done(), "it has bytes past its end");
    check(st.documents == static_cast<int64_t>(n), "its document count disagrees");
    for (uint64_t i = 0; i < n; ++i)
      check(offset[i] <= limit && length[i] <= limit - offset[i],
            "a document lies outside the file");
    f->built_offset.clear();
    f->built_offset.shrink_to_fit();
    f->built_length.clear();
    f->built_length.shrink_to_fit();
    f->offset = offset;
    f->length = length;
    f->count = static_cast<size_t>(n);
    f->mapped = std::move(map);
    f->gzip = std::move(gz);
    f->stats = st;
    return true;
  } catch (const Error& e) {
    *why = std::string("it is damaged (") + e.what() + ")";
    return false;
  }
}

// --- the corpus -------------------------------------------------------------------------------

class IndexedCorpus final : public TextCorpus {
 public:
  IndexedCorpus(std::vector<FileIndex> files, const SourceOptions& o)
      : files_(std::move(files)), o_(o) {
    starts_.push_back(0);
    for (const auto& f : files_)
      starts_.push_back(starts_.back() +
                        static_cast<int64_t>(f.held.empty() ? f.count : f.held.size()));
  }
  ~IndexedCorpus() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const override { return starts_.back(); }

  void text(int64_t i, std::string* out) const override {
    const size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) -
                                         starts_.begin() - 1);
    const FileIndex& f = files_[k];
    const auto d = static_cast<size_t>(i - starts_[k]);
    if (!f.held.empty()) {
      *out = f.held[d];
      return;
    }
    read(k, f.offset[d], f.length[d], out);
    if (find_invalid_utf8(*out) != std::string::npos)
      *out = HfTokenizer::sanitize_utf8(*out, nullptr);
    if (f.format == kFortunes && (out->empty() || out->back() != '\n')) *out += '\n';
    if (f.format != kJsonl) return;
    SourceStats ignored;
    std::string doc;
    parse_json_line(*out, f.path, 0, o_, &ignored,
                    [&](const nlohmann::json& j, const std::string& w, const std::string& what) {
                      json_document(j, w, what, o_, false, &ignored, &doc);
                    });
    *out = std::move(doc);
  }

 private:
  // The bytes [at, at + n) of file k; one file (the last read) is kept open.
  void read(size_t k, uint64_t at, uint64_t n, std::string* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    const FileIndex& f = files_[k];
    if (f.gzip) {
      if (!gz_ || open_ != k) gz_ = std::make_unique<GzipRanges>(f.path, f.gzip);
      open_ = k;
      gz_->read(at, n, out);
      return;
    }
    if (fd_ < 0 || open_ != k) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      check(fd_ >= 0, "cannot read dataset file '" + f.path + "': " + io::errno_message(errno));
      open_ = k;
    }
    out->resize(static_cast<size_t>(n));
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd_, out->data() + done, static_cast<size_t>(n - done),
                                  static_cast<off_t>(at + done));
      if (got < 0 && errno == EINTR) continue;
      check(got > 0, "cannot read dataset file '" + f.path + "'" +
                         (got < 0 ? ": " + io::errno_message(errno)
                                  : std::string(": it is shorter than when it was indexed")));
      done += static_cast<uint64_t>(got);
    }
  }

  std::vector<FileIndex> files_;
  SourceOptions o_;
  std::vector<int64_t> starts_;
  mutable std::mutex mu_;
  mutable int fd_ = -1;
  mutable size_t open_ = SIZE_MAX;
  mutable std::unique_ptr<GzipRanges> gz_;
};

Format format_code(const std::string& fmt) {
  return fmt == "jsonl" ? kJsonl : fmt == "fortunes" ? kFortunes : kText;
}

// A .json (or .json.gz) file's first non-blank byte is '[': one array, read whole.
bool json_array(const std::string& file) {
  if (file_format("jsonl", file) != "jsonl") return false;
  std::string head;
  if (is_gzip_name(file)) {
    if (fs::path(file.substr(0, file.size() - 3)).extension() != ".json") return false;
    head = read_gzip_head(file, 4096);
  } else {
    if (fs::path(file).extension() != ".json") return false;
    head = read_bytes(file, 4096);
  }
  const size_t first = head.find_first_not_of(" \t\r\n");
  return first != std::string::npos && head[first] == '[';
}

}  // namespace

std::shared_ptr<const TextCorpus> open_text_corpus(const SourceOptions& o,
                                                   const std::string& index_dir,
                                                   SourceStats* stats) {
  SourceStats local;
  SourceStats* st = stats ? stats : &local;
  *st = SourceStats{};
  const std::string path = source_path(o);
  const std::string dataset = effective_dataset(o);
  std::vector<FileIndex> files;
  std::vector<std::string> formats;  // as read, for the message of an empty dataset
  int64_t reused = 0;
  for (const auto& file : resolve_paths(path, o.section)) {
    const std::string fmt = file_format(dataset, file);
    if (std::find(formats.begin(), formats.end(), fmt) == formats.end()) formats.push_back(fmt);
    check(fmt != "tokens", file + ": a pre-tokenized shard among text files; use " + o.section +
                               ".dataset tokens with only token shards");
    io::check_input_file(file, "dataset file");
    FileIndex f;
    f.path = file;
    f.format = format_code(fmt);
    if (f.format == kJsonl && json_array(file)) {
      const std::string text = read_text_file(file, &f.stats);
      parse_json_array(text, file,
                       [&](const nlohmann::json& j, const std::string& at, const std::string& w) {
                         std::string doc;
                         if (json_document(j, at, w, o, true, &f.stats, &doc))
                           f.held.push_back(std::move(doc));
                       });
      f.stats.documents = static_cast<int64_t>(f.held.size());
      add_stats(f.stats, st);
      files.push_back(std::move(f));
      continue;
    }
    struct stat sb {};
    check(::stat(file.c_str(), &sb) == 0,
          "cannot read dataset file '" + file + "': " + io::errno_message(errno));
    f.file_size = static_cast<uint64_t>(sb.st_size);
    f.mtime_ns = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
    const std::string saved = index_dir.empty() ? "" : index_path(index_dir, file);
    std::string why;
    if (!saved.empty() && fs::exists(saved) && load_index(saved, o, &f, &why)) {
      ++reused;
    } else {
      if (!why.empty()) log::info(o.section + ": indexing " + file + " again: " + why);
      scan_file(o, &f);
      if (!saved.empty()) {  // a cache: a failure to keep it costs the next run a pass
        try {
          std::error_code ec;
          fs::create_directories(index_dir, ec);
          save_index(saved, f, o);
          load_index(saved, o, &f, &why);  // read it mapped from now on, as a later run would
        } catch (const Error& e) {
          log::warn(o.section + ": the index of " + file + " was not saved (" + e.what() +
                    "); the next run indexes it again");
        }
      }
    }
    add_stats(f.stats, st);
    files.push_back(std::move(f));
  }
  if (reused > 0)
    log::info(o.section + ": reused the saved index of " + std::to_string(reused) + " of " +
              std::to_string(files.size()) + " file(s) in " + index_dir);
  if (st->documents == 0) {
    // Name what was read, as it was read (the format by extension, not a default name).
    std::string read_as;
    for (const auto& f : formats) read_as += (read_as.empty() ? "" : "+") + f;
    const std::string problems = describe_problems(*st, o.text_field);
    throw Error("dataset '" + read_as + "' at '" + path + "' has no documents" +
                (problems.empty() ? "" : " (" + problems + ")") + "; point " + o.section +
                ".dataset_path at non-empty text");
  }
  return std::make_shared<IndexedCorpus>(std::move(files), o);
}

}  // namespace titan::data
