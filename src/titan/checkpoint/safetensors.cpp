// safetensors reading (mmap + validation) and writing (temp file + rename); the dtypes and the
// fp32 <-> F16/BF16 conversions live in core/dtype.cpp. Validation follows the reference Rust
// implementation where it matters for safety: every offset is checked against the data section,
// sizes against shapes (overflow-safe), and tensors may not overlap, so a view never reads outside
// the mapping or aliases another tensor.
#include "titan/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/progress.h"
#include "titan/core/test_hooks.h"

namespace titan::ckpt {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// The reference implementation's limit; a larger header is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string errno_str(int e) { return std::error_code(e, std::generic_category()).message(); }

// A parser message quotes the offending bytes, which may be invalid UTF-8 or control characters;
// keep the error one printable line.
std::string printable(const char* msg) {
  std::string r = msg;
  for (char& c : r)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) c = '?';
  return r;
}

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.substr(s.size() - suf.size()) == suf;
}

// numel * itemsize in bytes, false on overflow of size_t or of int64 element counts.
bool byte_size(const std::vector<int64_t>& shape, size_t itemsize, size_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  return !__builtin_mul_overflow(static_cast<size_t>(n), itemsize, out);
}

// JSON parsed with a check for repeated keys: nlohmann keeps the last of two equal keys
// silently, which would hide a second tensor of the same name. `dup` is the first repeated key,
// `dup_parent` the top-level key it sits under ("" for a repeated top-level key).
struct UniqueJson {
  json j;
  std::string dup, dup_parent;
  bool has_dup = false;
};

// Throws json::parse_error for text that is not JSON.
UniqueJson parse_unique(const std::string& text) {
  UniqueJson r;
  std::vector<std::set<std::string>> open;  // the keys seen in each enclosing object
  std::string top;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (open.size() == 1) top = k;
        if (!open.empty() && !open.back().insert(k).second && !r.has_dup) {
          r.has_dup = true;
          r.dup = k;
          r.dup_parent = open.size() == 1 ? "" : top;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  r.j = json::parse(text, cb);
  return r;
}

// ---- Writing.

struct Prepared {
  const WriteTensor* t;
  size_t nbytes;
};

// Validates tensors about to be written to `where`; returns them sorted by name with sizes.
std::vector<Prepared> prepare(const std::string& where, const std::vector<WriteTensor>& tensors) {
  std::vector<Prepared> r;
  r.reserve(tensors.size());
  for (const auto& t : tensors) {
    const std::string at = where + ": tensor '" + t.name + "'";
    check(t.name != "__metadata__", at + ": the name __metadata__ is reserved by the format");
    for (int64_t d : t.shape)
      check(d >= 0, at + ": negative dimension in shape " + shape_str(t.shape));
    size_t nb = 0;
    check(byte_size(t.shape, dtype_size(t.dtype), &nb),
          at + ": shape " + shape_str(t.shape) + " overflows the addressable size");
    check(nb == 0 || t.data != nullptr || t.fill, at + ": data is null");
    r.push_back({&t, nb});
  }
  std::sort(r.begin(), r.end(),
            [](const Prepared& a, const Prepared& b) { return a.t->name < b.t->name; });
  for (size_t i = 1; i < r.size(); ++i)
    check(r[i].t->name != r[i - 1].t->name,
          where + ": tensor '" + r[i].t->name + "' is given more than once");
  return r;
}

// The header JSON (metadata first, then tensors in name order with contiguous offsets), padded
// with spaces so that 8 + header length, the data start, is a multiple of 8.
std::string build_header(const std::string& where, const std::vector<Prepared>& ts,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = h["__metadata__"];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  uint64_t off = 0;
  for (const auto& p : ts) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(p.t->dtype);
    e["shape"] = p.t->shape;
    e["data_offsets"] = nlohmann::ordered_json::array({off, off + p.nbytes});
    h[p.t->name] = std::move(e);
    off += p.nbytes;
  }
  std::string s;
  try {
    s = h.dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(where + ": a tensor name or metadata string is not valid UTF-8");
  }
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      throw Error(path + ": write failed (" + errno_str(e) + ")");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Bytes to write: n at data, or (fill set) n made by fill, slice by slice, into a scratch buffer
// (elements of elem bytes).
struct Piece {
  const void* data;
  size_t n;
  const std::function<void(int64_t, int64_t, void*)>* fill;
  size_t elem = 1;
};

// Creates `path` (truncating), writes the pieces and fsyncs, so that a rename afterwards
// publishes a complete file. Throws titan::Error naming `shown` (the final path).
void write_pieces(const std::string& path, const std::string& shown,
                  const std::vector<Piece>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int open_errno = errno;
  check(fd >= 0, shown + ": cannot create " + path + " (" + errno_str(open_errno) + ")");
  constexpr size_t kSlice = size_t{64} << 20;  // a multiple of every element size
  std::vector<uint8_t> scratch;                // a filled piece's slice
  // Bytes [o, o + k) of piece pc (o and k whole elements).
  const auto bytes = [&](const Piece& pc, size_t o, size_t k) -> const char* {
    if (!pc.fill) return static_cast<const char*>(pc.data) + o;
    scratch.resize(std::max(scratch.size(), k));
    (*pc.fill)(static_cast<int64_t>(o / pc.elem), static_cast<int64_t>(k / pc.elem),
               scratch.data());
    return reinterpret_cast<const char*>(scratch.data());
  };
  try {
    size_t total = 0;
    for (const auto& pc : pieces) total += pc.n;
    if (test::kill_due("write:partial")) {  // a crash half-way through the file
      size_t left = total / 2;
      for (const auto& pc : pieces) {
        const size_t k = std::min(pc.n, left) / pc.elem * pc.elem;
        for (size_t o = 0; o < k; o += kSlice)
          write_all(fd, bytes(pc, o, std::min(kSlice, k - o)), std::min(kSlice, k - o), shown);
        left -= std::min(pc.n, left);
      }
      test::kill_now();
    }
    Progress progress("writing " + shown, static_cast<int64_t>(total));
    for (const auto& pc : pieces) {  // progress between slices of large tensors
      for (size_t o = 0; o < pc.n; o += kSlice) {
        const size_t k = std::min(kSlice, pc.n - o);
        write_all(fd, bytes(pc, o, k), k, shown);
        progress.add(static_cast<int64_t>(k));
      }
    }
    struct stat st;
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const bool synced = !regular || ::fsync(fd) == 0;
    const int e = errno;
    check(synced, shown + ": fsync failed (" + errno_str(e) + ")");
  } catch (...) {
    ::close(fd);
    throw;
  }
  const bool closed = ::close(fd) == 0;
  const int e = errno;
  check(closed, shown + ": close failed (" + errno_str(e) + ")");
}

// Writes a safetensors file at `tmp` for tensors already prepared.
void write_safetensors(const std::string& tmp, const std::string& shown,
                       const std::vector<Prepared>& ts,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(shown, ts, metadata);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  std::vector<Piece> pieces = {{len, 8, nullptr}, {header.data(), header.size(), nullptr}};
  for (const auto& p : ts)
    if (p.nbytes)
      pieces.push_back({p.t->data, p.nbytes, p.t->fill ? &p.t->fill : nullptr,
                        static_cast<size_t>(dtype_size(p.t->dtype))});
  write_pieces(tmp, shown, pieces);
}

std::string temp_name(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  const bool moved = ::rename(tmp.c_str(), path.c_str()) == 0;
  const int e = errno;
  check(moved, path + ": cannot move the finished temp file into place (" + errno_str(e) + ")");
}

// Best effort: makes the renames durable. A failure here loses nothing already visible.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// A file name an earlier write_model may have left: model.safetensors, the index, or a shard
// model-<digits>-of-<digits>.safetensors.
bool is_export_file(const std::string& n) {
  if (n == kSingleName || n == kIndexName) return true;
  constexpr std::string_view pre = "model-", mid = "-of-", suf = ".safetensors";
  std::string_view s = n;
  if (s.size() < pre.size() + suf.size() || s.substr(0, pre.size()) != pre || !ends_with(s, suf))
    return false;
  s = s.substr(pre.size(), s.size() - pre.size() - suf.size());
  const size_t m = s.find(mid);
  if (m == std::string_view::npos) return false;
  auto digits = [](std::string_view d) {
    return !d.empty() &&
           std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(s.substr(0, m)) && digits(s.substr(m + mid.size()));
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(map_, o.map_);
  std::swap(map_size_, o.map_size_);
  std::swap(tensors_, o.tensors_);
  std::swap(metadata_, o.metadata_);
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;  // owns the mapping from here on, so a validation failure unmaps it
  f.path_ = path;
  io::check_input_file(path, "safetensors file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int open_errno = errno;
  check(fd >= 0, path + ": cannot open (" + errno_str(open_errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat (" + errno_str(e) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(path + ": " + std::to_string(size) +
                " bytes, too short for the 8-byte header length; not a safetensors file");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file
  check(m != MAP_FAILED, path + ": mmap failed (" + errno_str(e) + ")");
  f.map_ = m;
  f.map_size_ = size;

  const auto* base = static_cast<const uint8_t*>(m);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(base[i]) << (8 * i);
  check(n <= kMaxHeaderBytes, path + ": header length " + std::to_string(n) +
                                  " exceeds the limit of 100000000 bytes; corrupt or not a "
                                  "safetensors file");
  check(n <= size - 8, path + ": header length " + std::to_string(n) +
                           " runs past the end of the " + std::to_string(size) +
                           "-byte file; truncated or not a safetensors file");
  f.parse_header(std::string(reinterpret_cast<const char*>(base + 8), n), base + 8 + n,
                 size - 8 - n);
  return f;
}

// Long because every check of the format's header is here, each with its own message: the JSON,
// __metadata__, dtype names, shapes, offsets in bounds, ordered and without gaps or overlaps.
// Fills tensors_ and metadata_ from the header text; the data section is [data, data + size).
void SafetensorsFile::parse_header(const std::string& header, const uint8_t* data,
                                   size_t data_size) {
  const std::string& p = path_;
  check(!header.empty() && header[0] == '{',
        p + ": header does not start with '{'; not a safetensors file");
  UniqueJson u;
  try {
    u = parse_unique(header);
  } catch (const json::exception& e) {
    throw Error(p + ": header is not valid JSON (" + printable(e.what()) + ")");
  }
  if (u.has_dup) {
    if (u.dup_parent.empty())
      throw Error(p + ": tensor '" + u.dup + "' appears more than once in the header");
    throw Error(p + ": " +
                (u.dup_parent == "__metadata__" ? std::string("__metadata__")
                                                : "tensor '" + u.dup_parent + "'") +
                ": key \"" + u.dup + "\" appears more than once");
  }
  const json& j = u.j;
  check(j.is_object(), p + ": header is not a JSON object");

  struct Range {
    uint64_t begin, end;
    size_t idx;
  };
  std::vector<Range> ranges;
  for (const auto& [name, v] : j.items()) {  // std::map order: sorted by name
    if (name == "__metadata__") {
      check(v.is_object(), p + ": __metadata__ is not a JSON object of string values");
      for (const auto& [k, mv] : v.items()) {
        check(mv.is_string(), p + ": __metadata__ entry '" + k + "' is not a string");
        metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    const std::string at = p + ": tensor '" + name + "'";
    check(v.is_object(), at + ": entry is not a JSON object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      check(v.contains(key), at + ": missing \"" + key + "\"");

    const json& jd = v["dtype"];
    check(jd.is_string(), at + ": \"dtype\" is not a string");
    DType dt = DType::U8;
    check(try_parse_dtype(jd.get<std::string>(), &dt),
          at + ": unknown dtype '" + jd.get<std::string>() + "' (expected one of " +
              dtype_name_list() + ")");

    const json& js = v["shape"];
    check(js.is_array(), at + ": \"shape\" is not an array");
    std::vector<int64_t> shape;
    for (const auto& d : js) {
      check(d.is_number_integer(), at + ": \"shape\" holds " + d.dump() + ", not an integer");
      if (d.is_number_unsigned()) {
        const auto u64 = d.get<uint64_t>();
        check(u64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              at + ": dimension " + std::to_string(u64) + " is too large");
        shape.push_back(static_cast<int64_t>(u64));
      } else {
        const auto i64 = d.get<int64_t>();
        check(i64 >= 0, at + ": negative dimension " + std::to_string(i64) + " in shape");
        shape.push_back(i64);
      }
    }

    const json& jo = v["data_offsets"];
    check(
        jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
        at + ": \"data_offsets\" must be two non-negative integers [begin, end], got " + jo.dump());
    const auto begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    const std::string offs = " [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    check(begin <= end, at + ": data_offsets" + offs + " have begin > end");
    check(end <= data_size, at + ": data_offsets" + offs + " run past the data section (" +
                                std::to_string(data_size) + " bytes)");
    size_t nbytes = 0;
    check(byte_size(shape, dtype_size(dt), &nbytes),
          at + ": shape " + shape_str(shape) + " overflows the addressable size");
    check(nbytes == end - begin, at + ": shape " + shape_str(shape) + " of " + dtype_name(dt) +
                                     " needs " + std::to_string(nbytes) +
                                     " bytes but data_offsets" + offs + " hold " +
                                     std::to_string(end - begin));
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back({name, dt, std::move(shape), data + begin, nbytes});
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin and disjoint so far, so the previous range holds the largest end.
  for (size_t i = 1; i < ranges.size(); ++i)
    check(ranges[i].begin >= ranges[i - 1].end,
          p + ": tensors '" + tensors_[ranges[i - 1].idx].name + "' and '" +
              tensors_[ranges[i].idx].name + "' have overlapping data_offsets");
  // As the reference reader (Metadata::validate): the tensors tile the data section from byte 0
  // to its end, without gaps or trailing bytes.
  uint64_t end = 0;
  for (const Range& r : ranges) {
    check(r.begin == end, p + ": tensor '" + tensors_[r.idx].name + "' starts at data byte " +
                              std::to_string(r.begin) + " but the data before it ends at byte " +
                              std::to_string(end) +
                              "; a gap in the data section (corrupt or not written by a "
                              "safetensors writer)");
    end = r.end;
  }
  check(end == data_size, p + ": " + std::to_string(data_size - end) +
                              " trailing byte(s) after the last tensor's data (the data section "
                              "holds " +
                              std::to_string(data_size) + " bytes, the tensors end at " +
                              std::to_string(end) + "); the file is corrupt or was appended to");
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

// ---- SafetensorsSet

namespace {

// Reads the index at `index_path` and returns its weight_map (name -> shard file), validated.
std::map<std::string, std::string> read_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  check(static_cast<bool>(in), index_path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(!in.bad(), index_path + ": read failed");
  UniqueJson u;
  try {
    u = parse_unique(text);
  } catch (const json::exception& e) {
    throw Error(index_path + ": not valid JSON (" + printable(e.what()) + ")");
  }
  check(!u.has_dup, index_path + ": key '" + u.dup + "' appears more than once" +
                        (u.dup_parent.empty() ? "" : " in \"" + u.dup_parent + "\""));
  check(u.j.is_object(), index_path + ": not a JSON object");
  auto wm = u.j.find("weight_map");
  check(wm != u.j.end(), index_path + ": missing \"weight_map\"");
  check(wm->is_object(), index_path + ": \"weight_map\" is not a JSON object");
  std::map<std::string, std::string> r;
  for (const auto& [name, shard] : wm->items()) {
    check(shard.is_string(),
          index_path + ": weight_map entry for tensor '" + name + "' is not a file name string");
    const auto s = shard.get<std::string>();
    const fs::path sp(s);
    bool up = false;
    for (const auto& part : sp) up |= part == "..";
    check(!s.empty() && !sp.is_absolute() && !up,
          index_path + ": tensor '" + name + "' maps to '" + s +
              "', not a file name inside the index's directory");
    r[name] = s;
  }
  return r;
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  SafetensorsSet s;
  s.path_ = path;
  std::error_code ec;
  const fs::path p(path);
  const auto st = fs::status(p, ec);
  check(fs::exists(st), path + ": no such file or directory");

  std::string index_path;
  if (fs::is_directory(st)) {
    if (fs::exists(p / kSingleName, ec)) {
      s.files_.push_back(SafetensorsFile::open((p / kSingleName).string()));
    } else if (fs::exists(p / kIndexName, ec)) {
      index_path = (p / kIndexName).string();
    } else {
      throw Error(path + ": holds neither " + kSingleName + " nor " + kIndexName);
    }
  } else if (ends_with(path, ".json")) {
    index_path = path;
  } else {
    s.files_.push_back(SafetensorsFile::open(path));
  }

  std::map<std::string, std::string> weight_map;
  std::map<std::string, size_t> file_of_shard;
  if (!index_path.empty()) {
    weight_map = read_index(index_path);
    std::set<std::string> shards;
    for (const auto& [name, shard] : weight_map) shards.insert(shard);
    const fs::path dir = fs::path(index_path).parent_path();
    for (const auto& shard : shards) {
      const fs::path full = dir / shard;
      check(fs::is_regular_file(full, ec), index_path + ": shard '" + shard +
                                               "' listed in weight_map is missing (" +
                                               full.string() + ")");
      file_of_shard[shard] = s.files_.size();
      s.files_.push_back(SafetensorsFile::open(full.string()));
    }
  }

  for (size_t f = 0; f < s.files_.size(); ++f) {
    const auto& ts = s.files_[f].tensors();
    for (size_t t = 0; t < ts.size(); ++t) {
      auto [it, fresh] = s.index_.try_emplace(ts[t].name, f, t);
      check(fresh, path + ": tensor '" + ts[t].name + "' is present in both " +
                       s.files_[it->second.first].path() + " and " + s.files_[f].path());
    }
  }
  for (const auto& [name, shard] : weight_map) {
    const size_t f = file_of_shard.at(shard);
    auto it = s.index_.find(name);
    check(it != s.index_.end() && it->second.first == f,
          s.files_[f].path() + ": tensor '" + name + "' listed in " + index_path +
              " weight_map is absent from this shard");
  }
  return s;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> r;
  r.reserve(index_.size());
  for (const auto& [name, loc] : index_) r.push_back(name);
  return r;
}

const TensorView* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  return &files_[it->second.first].tensors()[it->second.second];
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  static const std::string kNone;
  auto it = index_.find(name);
  return it == index_.end() ? kNone : files_[it->second.first].path();
}

void SafetensorsSet::read_f32_range(const std::string& name, const std::vector<int64_t>& shape,
                                    int64_t begin, int64_t end, float* dst) const {
  const TensorView* t = find(name);
  check(t != nullptr, path_ + ": tensor '" + name + "' not found");
  const std::string at = file_of(name) + ": tensor '" + name + "'";
  check(t->shape == shape,
        at + " has shape " + shape_str(t->shape) + ", expected " + shape_str(shape));
  check(
      t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16 ||
          t->dtype == DType::F64,
      at + " has dtype " + dtype_name(t->dtype) + "; only F32, F16, BF16 and F64 convert to fp32");
  check(0 <= begin && begin <= end && end <= t->numel(),
        at + ": elements [" + std::to_string(begin) + ", " + std::to_string(end) +
            ") are not within its " + std::to_string(t->numel()));
  to_f32(t->dtype, t->data + static_cast<size_t>(begin) * dtype_size(t->dtype), end - begin, dst);
  if (progress_) progress_->add((end - begin) * static_cast<int64_t>(dtype_size(t->dtype)));
}

int64_t SafetensorsSet::total_bytes() const {
  int64_t n = 0;
  for (const auto& f : files_)
    for (const auto& t : f.tensors()) n += static_cast<int64_t>(t.nbytes);
  return n;
}

// ---- Writing

void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                std::map<std::string, std::string> metadata) {
  const auto ts = prepare(path, tensors);
  metadata.try_emplace("format", "pt");
  if (io::is_special_file(path)) {  // /dev/null, a FIFO: written through, never renamed over
    write_safetensors(path, path, ts, metadata);
    return;
  }
  const std::string tmp = temp_name(path);
  try {
    write_safetensors(tmp, path, ts, metadata);
    rename_into_place(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void write_model(const std::string& dir, const std::vector<WriteTensor>& tensors,
                 int64_t max_shard_bytes, std::map<std::string, std::string> metadata) {
  check(max_shard_bytes > 0,
        dir + ": max_shard_bytes must be positive, got " + std::to_string(max_shard_bytes));
  const fs::path d(dir);
  const auto ts = prepare(dir, tensors);
  metadata.try_emplace("format", "pt");
  std::error_code ec;
  fs::create_directories(d, ec);
  check(!ec, dir + ": cannot create the directory (" + ec.message() + ")");

  // Greedy in name order: a new shard when the next tensor would push a non-empty one past the
  // limit, so a tensor above the limit ends up alone.
  const auto limit = static_cast<uint64_t>(max_shard_bytes);
  uint64_t total = 0;
  for (const auto& p : ts) total += p.nbytes;
  std::vector<std::vector<Prepared>> shards(1);
  uint64_t cur = 0;
  for (const auto& p : ts) {
    if (total > limit && cur > 0 && cur + p.nbytes > limit) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(p);
    cur += p.nbytes;
  }

  struct Out {
    std::string tmp, final_path;
  };
  std::vector<Out> outs;
  std::set<std::string> new_names;
  try {
    if (shards.size() == 1) {
      outs.push_back({temp_name((d / kSingleName).string()), (d / kSingleName).string()});
      new_names.insert(kSingleName);
      write_safetensors(outs.back().tmp, outs.back().final_path, shards[0], metadata);
    } else {
      json index;
      index["metadata"]["total_size"] = total;
      index["weight_map"] = json::object();
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::string name = shard_name(i, shards.size());
        for (const auto& p : shards[i]) index["weight_map"][p.t->name] = name;
        outs.push_back({temp_name((d / name).string()), (d / name).string()});
        new_names.insert(name);
        write_safetensors(outs.back().tmp, outs.back().final_path, shards[i], metadata);
      }
      const std::string text = index.dump(2) + "\n";
      // The index goes last, so it is renamed after every shard it points at.
      outs.push_back({temp_name((d / kIndexName).string()), (d / kIndexName).string()});
      new_names.insert(kIndexName);
      write_pieces(outs.back().tmp, outs.back().final_path, {{text.data(), text.size(), nullptr}});
    }
  } catch (...) {
    for (const auto& o : outs) ::unlink(o.tmp.c_str());
    throw;
  }

  for (size_t i = 0; i < outs.size(); ++i) {
    if (::rename(outs[i].tmp.c_str(), outs[i].final_path.c_str()) != 0) {
      const int e = errno;
      for (size_t k = i; k < outs.size(); ++k) ::unlink(outs[k].tmp.c_str());
      throw Error(outs[i].final_path + ": cannot move the finished temp file into place (" +
                  errno_str(e) + "); the export in " + dir + " is incomplete");
    }
  }

  // Only now, with the new export complete, drop what an earlier one left behind.
  for (const auto& entry : fs::directory_iterator(d, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_export_file(name) || new_names.count(name)) continue;
    std::error_code rec;
    fs::remove(entry.path(), rec);
    check(!rec, entry.path().string() + ": cannot remove this file of an earlier export (" +
                    rec.message() + "); remove it by hand");
  }
  check(!ec, dir + ": cannot list the directory (" + ec.message() + ")");
  fsync_dir(dir);
}

}  // namespace titan::ckpt
