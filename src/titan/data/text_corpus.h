// Text documents read in place, so that a corpus larger than memory streams: one pass over each
// file (text_source.h's formats; gzip-compressed files, .gz, inflated as they are read) records
// where each document is, and a document's text is read back when the loader asks for it (pread
// on plain files; from the nearest access point on gzip files, gzip_file.h). Only the offsets
// stay in memory: 12 bytes a document, plus 32 KiB per 4 MiB of gzip text.
//
// The index of a file can be kept in a folder (index_dir; the trainer uses DUMP_FOLDER/
// dataset_index) as FILENAME.HASH.idx, HASH naming the file's absolute path, and is then read
// memory-mapped (the ranks of a host share its pages). A saved index is used when it was made
// for the same file size and modification time and the same reading options (format, text
// field, skip_malformed); otherwise, or when it is damaged, it is made again and replaced
// (written to a temporary name, then renamed). An index that cannot be saved is a warning.
//
// Index file format, little-endian: magic "TITANIDX", u32 version 1, u32 format (0 text,
// 1 fortunes, 2 jsonl), u64 file size, i64 modification time (ns), u8 skip_malformed, string
// text_field, the file's SourceStats (5 × i64: documents, empty, malformed, missing_field,
// utf8_replaced; 3 strings: first_malformed, first_missing, first_utf8), zeros to a multiple of
// 8 bytes, u64 n, n × u64 offset, n × u32 length, zeros to a multiple of 8, then for gzip files
// u64 uncompressed size, u64 m, m × (u64 in, u64 out, i32 bits), m × 32768 window bytes. A
// string is u32 length + bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/data/text_source.h"

namespace titan::data {

class TextCorpus {
 public:
  virtual ~TextCorpus() = default;
  virtual int64_t size() const = 0;
  // Replaces *out with document i's text, as read_documents gives it.
  virtual void text(int64_t i, std::string* out) const = 0;
};

// Documents held in memory.
class MemoryCorpus final : public TextCorpus {
 public:
  explicit MemoryCorpus(std::vector<std::string> docs) : docs_(std::move(docs)) {}
  int64_t size() const override { return static_cast<int64_t>(docs_.size()); }
  void text(int64_t i, std::string* out) const override { *out = docs_[static_cast<size_t>(i)]; }

 private:
  std::vector<std::string> docs_;
};

// The text documents of o (the files o.path names, read as text_source.h describes), indexed as
// above; index_dir empty: nothing saved. Throws titan::Error as read_documents does. *stats
// (when not null) receives the counts.
std::shared_ptr<const TextCorpus> open_text_corpus(const SourceOptions& o,
                                                   const std::string& index_dir,
                                                   SourceStats* stats = nullptr);

}  // namespace titan::data
