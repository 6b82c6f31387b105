#include "titan/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>

#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/progress.h"

namespace titan::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

uint64_t read_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t read_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

TokenShard TokenShard::open(const std::string& path) {
  TokenShard s;
  s.path_ = path;
  io::check_input_file(path, "token shard");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, path + ": cannot open the token shard: " + std::strerror(errno));
  struct stat stt {};
  if (fstat(fd, &stt) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat the token shard");
  }
  const auto size = static_cast<uint64_t>(stt.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw Error(path + ": not a titan token shard (" + std::to_string(size) +
                " bytes, shorter than the " + std::to_string(kShardHeaderBytes) + "-byte header)");
  }
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  check(m != MAP_FAILED, path + ": cannot map the token shard: " + std::strerror(errno));
  s.map_ = m;
  s.map_bytes_ = size;
  const auto* p = static_cast<const unsigned char*>(m);
  check(std::memcmp(p, kShardMagic, 8) == 0,
        path + ": not a titan token shard (bad magic; make one with titan tokenize)");
  const uint32_t version = read_u32(p + 8), dtype = read_u32(p + 12);
  check(version == kShardVersion, path + ": token shard version " + std::to_string(version) +
                                      " is not supported (this titan reads version " +
                                      std::to_string(kShardVersion) + ")");
  check(dtype == kShardDtypeU32, path + ": token shard id dtype " + std::to_string(dtype) +
                                     " is not supported (1 = uint32)");
  s.num_tokens_ = read_u64(p + 16);
  s.num_docs_ = read_u64(p + 24);
  s.vocab_ = read_u64(p + 32);
  // Sizes checked without overflow: both counts are bounded by the file size first.
  check(s.num_docs_ < size / 8 && s.num_tokens_ <= size / 4,
        path + ": corrupt token shard (document or token count larger than the file)");
  const uint64_t want = kShardHeaderBytes + 8 * (s.num_docs_ + 1) + 4 * s.num_tokens_;
  check(size == want, path + ": truncated or corrupt token shard: " + std::to_string(s.num_docs_) +
                          " documents and " + std::to_string(s.num_tokens_) + " tokens need " +
                          std::to_string(want) + " bytes, the file has " + std::to_string(size));
  check(s.vocab_ > 0 && s.vocab_ <= (uint64_t{1} << 31),
        path + ": corrupt token shard (vocabulary size " + std::to_string(s.vocab_) + ")");
  s.offsets_ = reinterpret_cast<const uint64_t*>(p + kShardHeaderBytes);
  s.ids_ = reinterpret_cast<const uint32_t*>(p + kShardHeaderBytes + 8 * (s.num_docs_ + 1));
  check(s.offsets_[0] == 0 && s.offsets_[s.num_docs_] == s.num_tokens_,
        path + ": corrupt token shard (document offsets do not span the tokens)");
  for (uint64_t d = 0; d < s.num_docs_; ++d) {
    check(s.offsets_[d] <= s.offsets_[d + 1],
          path + ": corrupt token shard (offsets decrease at document " + std::to_string(d) + ")");
  }
  return s;
}

TokenShard::TokenShard(TokenShard&& o) noexcept { *this = std::move(o); }

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    num_docs_ = o.num_docs_;
    num_tokens_ = o.num_tokens_;
    vocab_ = o.vocab_;
    offsets_ = o.offsets_;
    ids_ = o.ids_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

TokenShard::~TokenShard() {
  if (map_) munmap(map_, map_bytes_);
}

std::span<const uint32_t> TokenShard::document(int64_t d) const {
  const auto i = static_cast<uint64_t>(d);
  return {ids_ + offsets_[i], static_cast<size_t>(offsets_[i + 1] - offsets_[i])};
}

void write_token_shard(const std::string& path, const std::vector<uint64_t>& offsets,
                       const std::vector<uint32_t>& ids, int64_t vocab_size) {
  check(!offsets.empty() && offsets.front() == 0 && offsets.back() == ids.size(),
        "token shard offsets do not span the ids");
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  const uint32_t version = kShardVersion, dtype = kShardDtypeU32;
  const uint64_t T = ids.size(), D = offsets.size() - 1, V = static_cast<uint64_t>(vocab_size);
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &dtype, 4);
  std::memcpy(header + 16, &T, 8);
  std::memcpy(header + 24, &D, 8);
  std::memcpy(header + 32, &V, 8);
  // Written whole under a temporary name, then renamed: a failure (a full disk) leaves no
  // partial shard and names the file; a killed earlier run's temporary file is removed first.
  const std::filesystem::path p(path);
  io::remove_stale_temps(p.parent_path().string(), p.filename().string());
  io::write_file_atomic(
      path, {std::string_view(reinterpret_cast<const char*>(header), sizeof header),
             std::string_view(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8),
             std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4)});
}

TokenizeStats tokenize_to_shard(const SourceOptions& source, const Tokenizer& tok,
                                const std::string& output) {
  check(!output.empty(), "titan tokenize needs --output FILE.bin");
  TokenizeStats r;
  const std::vector<std::string> docs = read_documents(source, &r.source);
  const auto n = static_cast<int64_t>(docs.size());
  std::vector<std::vector<int32_t>> enc(docs.size());
  std::exception_ptr failure;
  Progress progress("tokenizing " + source.path, n, false, "documents");
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < n; ++i) {
    try {
      tok.encode(docs[i], true, true, &enc[i]);
      progress.add(1);
    } catch (...) {
#pragma omp critical(titan_tokenize_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  std::vector<uint64_t> offsets(docs.size() + 1, 0);
  for (int64_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + enc[i].size();
  std::vector<uint32_t> ids;
  ids.reserve(offsets.back());
  for (auto& e : enc) {
    for (int32_t id : e) ids.push_back(static_cast<uint32_t>(id));
    std::vector<int32_t>().swap(e);
  }
  write_token_shard(output, offsets, ids, tok.vocab_size());
  r.documents = n;
  r.tokens = static_cast<int64_t>(ids.size());
  return r;
}

}  // namespace titan::data
