// torchtitan's text packing (torchtitan.md §5): each document is tokenized with BOS and EOS,
// shifted inside the document (input = ids[:-1], label = ids[1:]), given positions 0,1,2,...
// (modulo seq_len), concatenated and cut into rows of exactly seq_len tokens; a row's leading
// partial document is re-based to start at position 0. With dp_world N, rank r reads documents
// r, r+N, ... (the validator's split; the trainer reads one stream on every rank, dp_world 1,
// and takes its rows of each global batch); epoch 0 keeps file order, later epochs are
// reshuffled (seed + epoch).
// With repeat off the loader stops at the end of one pass (validation): the last batch may hold
// fewer rows, the rest padded (input 0, label -100, positions 0,1,...), and an incomplete last
// row is dropped. Datasets with a loss mask (chat data, chat_dataset.h) label an id -100 where
// the mask leaves it untrained; datasets that are not packed (sft.packing false) give each
// document its own row: its first seq_len inputs and labels, then padding (input 0, label -100,
// positions counting on, so attention stays causal).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/data/byte_tokenizer.h"
#include "titan/data/dataset.h"

namespace titan::data {

struct LoaderOptions {
  int64_t batch = 1, seq_len = 2048;
  int64_t dp_rank = 0, dp_world = 1;
  bool shuffle = true;
  uint64_t seed = 42;
  bool repeat = true;  // false: one pass, then next() returns 0
};

class PackedLoader {
 public:
  PackedLoader(std::shared_ptr<const DocumentSet> docs, const LoaderOptions& opt);
  // Text documents with the byte-level tokenizer.
  PackedLoader(std::vector<std::string> docs, const ByteTokenizer& tok, const LoaderOptions& opt);

  // Fills input/labels/positions, each [batch × seq_len], and returns the number of real rows:
  // always batch when repeating (the data repeats forever); 0 at the end of a single pass.
  int64_t next(int32_t* input, int32_t* labels, int32_t* positions);
  int64_t epoch() const { return epoch_; }

  // Everything needed to continue exactly where this loader is: the batch after restore() is
  // the batch that would have come next. restore() checks every field (types, the options, the
  // order against this rank's documents, the cursor, ids against the vocabulary, positions) and
  // throws titan::Error naming the field, leaving the loader unchanged.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  void refill();
  std::shared_ptr<const DocumentSet> docs_;
  LoaderOptions opt_;
  std::vector<int64_t> order_;  // this rank's documents for the current epoch
  int64_t cursor_ = 0, epoch_ = 0;
  bool exhausted_ = false;                     // single pass: every document has been read
  std::vector<int32_t> in_, lab_, pos_, ids_;  // pending tokens
  std::vector<uint8_t> trained_;               // the document's trained flags (has_mask())
  size_t head_ = 0;
};

}  // namespace titan::data
