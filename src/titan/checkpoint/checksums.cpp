#include "titan/checkpoint/checksums.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "nlohmann/json.hpp"
#include "titan/checkpoint/safetensors.h"
#include "titan/checkpoint/xxh3.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/progress.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex(const json& v, uint64_t* out) {
  if (!v.is_string()) return false;
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  *out = std::stoull(s, nullptr, 16);
  return true;
}

size_t num_chunks(uint64_t bytes) {
  return static_cast<size_t>((bytes + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
}

// A read-only mapping of a whole file (nullptr data for an empty one).
struct FileMap {
  void* data = nullptr;
  size_t size = 0;
  explicit FileMap(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      throw Error(path + ": cannot open (" + io::errno_message(e) + ")");
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      throw Error(path + ": cannot stat (" + io::errno_message(e) + ")");
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      const int e = errno;
      if (data == MAP_FAILED) {
        ::close(fd);
        throw Error(path + ": mmap failed (" + io::errno_message(e) + ")");
      }
    }
    ::close(fd);
  }
  ~FileMap() {
    if (data) ::munmap(data, size);
  }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
};

}  // namespace

std::vector<uint64_t> chunk_hashes(const void* data, size_t n) {
  const size_t chunks = num_chunks(n);
  std::vector<uint64_t> r(chunks);
  const auto* p = static_cast<const uint8_t*>(data);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = c * kChecksumChunkBytes;
    r[c] = xxh3::hash(p + off, std::min(kChecksumChunkBytes, n - off));
  }
  return r;
}

std::vector<uint64_t> file_chunk_hashes(const std::string& path) {
  FileMap m(path);
  return chunk_hashes(m.data, m.size);
}

json file_checksum_entry(const std::string& path) {
  FileMap m(path);
  json hashes = json::array();
  for (uint64_t h : chunk_hashes(m.data, m.size)) hashes.push_back(hex(h));
  return {{"bytes", m.size}, {"xxh3_64", std::move(hashes)}};
}

void write_checksums(const std::string& dir, const json& known) {
  json files = json::object();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code fec;
    if (name == kChecksumsName || !e.is_regular_file(fec)) continue;
    files[name] = known.is_object() && known.contains(name)
                      ? known[name]
                      : file_checksum_entry(e.path().string());
  }
  check(!ec, dir + ": cannot list (" + ec.message() + ")");
  const json j = {{"algorithm", "xxh3_64"}, {"chunk_bytes", kChecksumChunkBytes}, {"files", files}};
  io::write_file_atomic((fs::path(dir) / kChecksumsName).string(), j.dump(1) + "\n");
}

std::optional<std::map<std::string, FileSum>> read_checksums(const std::string& dir) {
  const std::string path = (fs::path(dir) / kChecksumsName).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(!in.bad(), path + ": read failed");
  const json j = json::parse(text, nullptr, false);
  check(!j.is_discarded(), path + ": not valid JSON; the directory is damaged");
  check(j.is_object() && j.value("algorithm", json()) == "xxh3_64",
        path + ": \"algorithm\" must be \"xxh3_64\"");
  check(j.value("chunk_bytes", json()) == kChecksumChunkBytes,
        path + ": \"chunk_bytes\" must be " + std::to_string(kChecksumChunkBytes));
  check(j.contains("files") && j["files"].is_object(), path + ": \"files\" must be an object");
  std::map<std::string, FileSum> r;
  for (const auto& [name, v] : j["files"].items()) {
    const std::string at = path + ": \"files\".\"" + name + "\"";
    check(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
          at + " is not a file name");
    check(v.is_object() && v.contains("bytes") && v["bytes"].is_number_unsigned() &&
              v.contains("xxh3_64") && v["xxh3_64"].is_array(),
          at + " must be {\"bytes\": N, \"xxh3_64\": [16 hex digits per chunk]}");
    FileSum s;
    s.bytes = v["bytes"].get<uint64_t>();
    check(v["xxh3_64"].size() == num_chunks(s.bytes),
          at + ": " + std::to_string(v["xxh3_64"].size()) + " chunk hashes for " +
              std::to_string(s.bytes) + " bytes");
    for (const auto& h : v["xxh3_64"]) {
      uint64_t x = 0;
      check(parse_hex(h, &x), at + ": a chunk hash is not 16 lowercase hex digits");
      s.chunks.push_back(x);
    }
    r[name] = std::move(s);
  }
  return r;
}

void read_verified(const std::string& path, const uint8_t* file, size_t size,
                   std::vector<TensorRead> reads, const FileSum* sum, Progress* progress) {
  check(!sum || sum->bytes == size,
        path + ": " + std::to_string(size) + " bytes, but " + kChecksumsName + " records " +
            std::to_string(sum ? sum->bytes : 0) + "; the file is truncated or damaged");
  std::sort(reads.begin(), reads.end(), [](const TensorRead& a, const TensorRead& b) {
    return a.tensor->data < b.tensor->data;
  });
  // Tensor byte ranges within the file; block boundaries are multiples of 1 MiB from the start
  // and tensor data starts 8-byte aligned, so a block never splits an element.
  std::vector<size_t> begin(reads.size()), end(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    begin[i] = static_cast<size_t>(reads[i].tensor->data - file);
    end[i] = begin[i] + reads[i].tensor->nbytes;
  }
  // Ask the kernel to start reading the file from disk at once (a quarter of the memory at
  // most; beyond that each chunk asks for the next few), so that hashing and copying overlap
  // the I/O of a file not in the page cache.
  const bool aligned =
      reinterpret_cast<uintptr_t>(file) % static_cast<uintptr_t>(::getpagesize()) == 0;
  const size_t upfront = std::min(size, static_cast<size_t>(::sysconf(_SC_PHYS_PAGES)) *
                                            static_cast<size_t>(::getpagesize()) / 4);
  if (aligned && upfront > 0) (void)::madvise(const_cast<uint8_t*>(file), upfront, MADV_WILLNEED);
  constexpr size_t kAhead = 4 * kChecksumChunkBytes;
  const size_t chunks = num_chunks(size);
  std::vector<uint64_t> got(chunks);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t a = c * kChecksumChunkBytes, b = std::min(size, a + kChecksumChunkBytes);
    if (aligned && a + kAhead > upfront)
      (void)::madvise(const_cast<uint8_t*>(file) + a, std::min(size - a, kAhead), MADV_WILLNEED);
    // Copies the tensor bytes of the file's bytes [lo, hi) out (cursor: the first tensor that
    // may still have bytes there; pieces come in order).
    struct Copier {
      const uint8_t* file;
      const std::vector<TensorRead>& reads;
      const std::vector<size_t>&begin, &end;
      size_t base, t;
      void copy(size_t lo, size_t hi) {
        while (t < reads.size() && end[t] <= lo) ++t;
        for (size_t k = t; k < reads.size() && begin[k] < hi; ++k) {
          const size_t x = std::max(begin[k], lo), y = std::min(end[k], hi);
          if (x >= y) continue;
          const TensorView& tv = *reads[k].tensor;
          const size_t el = dtype_size(tv.dtype);
          to_f32(tv.dtype, file + x, static_cast<int64_t>((y - x) / el),
                 reads[k].dst + (x - begin[k]) / el);
        }
      }
    } copier{file,  reads,
             begin, end,
             a,     static_cast<size_t>(std::upper_bound(end.begin(), end.end(), a) - end.begin())};
    // Pieces of 4 KiB (XXH3 blocks are 1 KiB; the boundaries are multiples of 1 KiB from the
    // file's start, and tensor data starts 8-byte aligned, so no piece splits an element): each
    // is copied out of L1 right after it was hashed, and the file's bytes are read from memory
    // once.
    if (sum)
      got[c] = xxh3::hash_visit(
          file + a, b - a, 4096,
          [](void* ctx, size_t off, size_t n) {
            auto& cp = *static_cast<Copier*>(ctx);
            cp.copy(cp.base + off, cp.base + off + n);
          },
          &copier);
    else
      copier.copy(a, b);
    if (progress) progress->add(static_cast<int64_t>(b - a));
  }
  if (!sum) return;
  for (size_t c = 0; c < chunks; ++c)
    check(got[c] == sum->chunks[c],
          path + ": checksum mismatch in bytes " + std::to_string(c * kChecksumChunkBytes) + ".." +
              std::to_string(std::min<uint64_t>((c + 1) * kChecksumChunkBytes, size)) +
              " (xxh3_64 " + hex(got[c]) + ", " + kChecksumsName + " records " +
              hex(sum->chunks[c]) + "); the file is damaged");
}

bool verify_checksums(const std::string& dir, const std::map<std::string, Mapped>& mapped,
                      const std::set<std::string>& skip) {
  const auto sums = read_checksums(dir);
  if (!sums) return false;
  for (const auto& [name, s] : *sums) {
    const std::string p = (fs::path(dir) / name).string();
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    check(!ec, p + ": listed in " + kChecksumsName + " but missing (" + ec.message() +
                   "); the directory is incomplete");
    check(size == s.bytes, p + ": " + std::to_string(size) + " bytes, but " + kChecksumsName +
                               " records " + std::to_string(s.bytes) +
                               "; the file is truncated or damaged");
    if (skip.count(name)) continue;
    std::vector<uint64_t> got;
    if (auto it = mapped.find(name); it != mapped.end() && it->second.size == size)
      got = chunk_hashes(it->second.data, it->second.size);
    else
      got = file_chunk_hashes(p);
    for (size_t c = 0; c < got.size(); ++c)
      check(got[c] == s.chunks[c],
            p + ": checksum mismatch in bytes " + std::to_string(c * kChecksumChunkBytes) + ".." +
                std::to_string(std::min<uint64_t>((c + 1) * kChecksumChunkBytes, size)) +
                " (xxh3_64 " + hex(got[c]) + ", " + kChecksumsName + " records " +
                hex(s.chunks[c]) + "); the file is damaged");
  }
  return true;
}

}  // namespace titan::ckpt
