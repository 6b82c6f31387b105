// Pre-tokenized binary shards ("titan tokenize --output F.bin"), memory-mapped by the loader so a
// large corpus is tokenized once. Layout, little-endian:
//   bytes  0..7   magic "TITANTOK"
//          8..11  uint32 version (1)
//         12..15  uint32 dtype of the ids (1 = uint32)
//         16..23  uint64 token count T
//         24..31  uint64 document count D
//         32..39  uint64 vocabulary size of the tokenizer that made it (every id is below it)
//         40..63  reserved, zero
//   then uint64 offsets[D + 1] (offsets[0] = 0, offsets[D] = T, non-decreasing): document d is
//   ids[offsets[d], offsets[d+1]); then uint32 ids[T]. A document's ids are exactly what the
//   loader feeds for it: the tokenizer's encode(text, add_bos=True, add_eos=True).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "titan/data/text_source.h"
#include "titan/data/tokenizer.h"

namespace titan::data {

inline constexpr char kShardMagic[8] = {'T', 'I', 'T', 'A', 'N', 'T', 'O', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardDtypeU32 = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// A read-only, memory-mapped shard.
class TokenShard {
 public:
  // Checks the header, size and offsets; throws titan::Error (one line, naming the file) for a
  // short, corrupt, foreign or newer file.
  static TokenShard open(const std::string& path);
  TokenShard(TokenShard&& o) noexcept;
  TokenShard& operator=(TokenShard&& o) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  int64_t num_documents() const { return static_cast<int64_t>(num_docs_); }
  int64_t num_tokens() const { return static_cast<int64_t>(num_tokens_); }
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_); }
  std::span<const uint32_t> document(int64_t d) const;
  const std::string& path() const { return path_; }

 private:
  TokenShard() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t num_docs_ = 0, num_tokens_ = 0, vocab_ = 0;
  const uint64_t* offsets_ = nullptr;
  const uint32_t* ids_ = nullptr;
};

// Writes a shard to path (through a temporary name, then renamed). offsets as in the layout.
void write_token_shard(const std::string& path, const std::vector<uint64_t>& offsets,
                       const std::vector<uint32_t>& ids, int64_t vocab_size);

struct TokenizeStats {
  SourceStats source;
  int64_t documents = 0, tokens = 0;
};

// Reads the documents of `source` exactly as the text loader would, encodes each with BOS/EOS
// (in parallel) and writes them as one shard to `output`.
TokenizeStats tokenize_to_shard(const SourceOptions& source, const Tokenizer& tok,
                                const std::string& output);

}  // namespace titan::data
