// Integrity of checkpoint and export directories: checksums.json records, for every other file
// of the directory, its size and the XXH3-64 hashes (xxHash, Debian's libxxhash) of its
// consecutive 16 MiB chunks (the last one shorter; none for an empty file):
//   {"algorithm": "xxh3_64", "chunk_bytes": 16777216,
//    "files": {"model.safetensors": {"bytes": 1234, "xxh3_64": ["0f1e...", ...]}}}
// (so `split -b 16M FILE` + `xxhsum -H3` reproduce them). Chunks let the check run on every
// core, over the very mapping the loader then reads, which keeps its cost within a few percent
// of a load. It is written last, just before the directory is renamed into place, and checked
// before anything is loaded from the directory, so a flipped bit or a truncated file is an error
// naming the file instead of silently wrong weights. Directories without it (written by an
// older titan, or by another tool) load unverified, with a warning.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace titan {
class Progress;
}

namespace titan::ckpt {

inline constexpr const char* kChecksumsName = "checksums.json";
inline constexpr size_t kChecksumChunkBytes = size_t{16} << 20;

// XXH3-64 of each kChecksumChunkBytes chunk of [data, data + n), computed in parallel.
std::vector<uint64_t> chunk_hashes(const void* data, size_t n);
// The same for a file; throws titan::Error naming it when it cannot be read.
std::vector<uint64_t> file_chunk_hashes(const std::string& path);

// One file's entry of checksums.json ({"bytes": N, "xxh3_64": [...]}), hashing the file.
nlohmann::json file_checksum_entry(const std::string& path);

// Hashes every regular file of dir except checksums.json and writes dir/checksums.json
// (atomically; throws titan::Error naming the file on failure). Files named in `known` (a JSON
// object of file name -> entry, made by file_checksum_entry where each was written: the ranks of
// a sharded save) take that entry instead of being hashed again.
void write_checksums(const std::string& dir, const nlohmann::json& known = nullptr);

struct FileSum {
  uint64_t bytes = 0;
  std::vector<uint64_t> chunks;
};

// dir/checksums.json parsed and checked for types; nullopt when there is none. Throws
// titan::Error naming the file when it is unreadable or malformed.
std::optional<std::map<std::string, FileSum>> read_checksums(const std::string& dir);

// A file's bytes, already in memory (a loader's mapping), by file name within the directory.
struct Mapped {
  const void* data;
  size_t size;
};

struct TensorView;

// One tensor of a mapped safetensors file to convert to fp32 into dst.
struct TensorRead {
  const TensorView* tensor;
  float* dst;
};

// Converts the tensors of one mapped file (bytes [file, file + size) of `path`) into their
// destinations in a single pass over the file, in parallel over its checksum chunks, each chunk
// hashed and copied out in one pass, 4 KiB at a time (xxh3::hash_visit: each piece is copied
// from L1 right after XXH3 read it, so memory is read once) (sum: the
// file's recorded checksums; nullptr reads without checking). Throws titan::Error naming the
// file on a mismatch (the destinations are then partly written).
// progress (optional) counts the bytes done.
void read_verified(const std::string& path, const uint8_t* file, size_t size,
                   std::vector<TensorRead> reads, const FileSum* sum, Progress* progress = nullptr);

// Checks every file listed in dir/checksums.json: present, of the recorded size and hashes;
// files in `mapped` are hashed from that memory, the others read, those in `skip` (checked by
// read_verified) only for size. Returns false (checking nothing) when there is no
// checksums.json. Throws titan::Error naming the first damaged or missing file.
bool verify_checksums(const std::string& dir, const std::map<std::string, Mapped>& mapped = {},
                      const std::set<std::string>& skip = {});

}  // namespace titan::ckpt
