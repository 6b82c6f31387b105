// The documents a loader reads, as token ids: text documents tokenized on the fly, pre-tokenized
// shards (token_shard.h) that give the same ids without the tokenizer, or conversations with a
// per-token loss mask (chat_dataset.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/data/text_corpus.h"
#include "titan/data/text_source.h"
#include "titan/data/token_shard.h"
#include "titan/data/tokenizer.h"

namespace titan::data {

class DocumentSet {
 public:
  virtual ~DocumentSet() = default;
  virtual int64_t size() const = 0;
  // Appends document i's ids as the loader feeds them: encode(text, add_bos=True, add_eos=True).
  virtual void tokens(int64_t i, std::vector<int32_t>* out) const = 0;
  // Every id is below this.
  virtual int64_t vocab_size() const = 0;
  // Where the ids come from, for messages ("dataloader.tokenizer 'byte'", "token shards ...").
  virtual std::string vocab_source() const = 0;
  // Whether some ids carry no loss (chat data: only the assistant turns are trained). Then the
  // loader asks trained_tokens and labels an id -100 where it is not trained.
  virtual bool has_mask() const { return false; }
  // Appends document i's ids (as tokens) and, per id, 1 when the loss is taken on predicting it
  // and 0 when not. This default: tokens(), every id trained.
  virtual void trained_tokens(int64_t i, std::vector<int32_t>* ids,
                              std::vector<uint8_t>* trained) const;
  // Whether the loader packs documents back to back into rows (true), or gives each document its
  // own row, cut to the row and padded (sft.packing false; best-fit packing, below).
  virtual bool packed() const { return true; }
  // A document made of parts that share one row (best-fit packing: whole conversations): how
  // many, and part k's ids and trained flags (appended). The loader gives each part its own
  // positions from 0 and never labels across two. Default: one part, trained_tokens(i).
  virtual int64_t parts(int64_t /*i*/) const { return 1; }
  virtual void part_tokens(int64_t i, int64_t /*k*/, std::vector<int32_t>* ids,
                           std::vector<uint8_t>* trained) const {
    trained_tokens(i, ids, trained);
  }
};

class TextDocuments final : public DocumentSet {
 public:
  TextDocuments(std::vector<std::string> docs, std::shared_ptr<const Tokenizer> tok,
                std::string section = "dataloader");
  // Documents read when asked for (text_corpus.h).
  TextDocuments(std::shared_ptr<const TextCorpus> corpus, std::shared_ptr<const Tokenizer> tok,
                std::string section = "dataloader");
  int64_t size() const override { return corpus_->size(); }
  void tokens(int64_t i, std::vector<int32_t>* out) const override;
  int64_t vocab_size() const override { return tok_->vocab_size(); }
  std::string vocab_source() const override;
  const std::shared_ptr<const Tokenizer>& tokenizer() const { return tok_; }

 private:
  std::shared_ptr<const TextCorpus> corpus_;
  std::shared_ptr<const Tokenizer> tok_;
  std::string section_;
};

class TokenDocuments final : public DocumentSet {
 public:
  explicit TokenDocuments(std::vector<TokenShard> shards);
  int64_t size() const override { return starts_.back(); }
  void tokens(int64_t i, std::vector<int32_t>* out) const override;
  int64_t vocab_size() const override { return vocab_; }
  std::string vocab_source() const override;

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> starts_;  // first document of each shard, then the total
  int64_t vocab_ = 0;
};

// Several sources interleaved by weight, as Hugging Face's interleave_datasets(probabilities,
// stopping_strategy="all_exhausted") and Megatron's blended datasets: document j of the mix comes
// from the source that smooth weighted round-robin picks at j (so every prefix of the mix holds
// each source within one document of its weight's share: the proportions are exact, and fixed by
// the weights alone), taking that source's documents in order and starting it again when it runs
// out. The mix is long enough for every document of every source to appear once: max over
// sources of (documents / weight), the weights normalized to sum to 1.
class MixedDocuments final : public DocumentSet {
 public:
  MixedDocuments(std::vector<std::shared_ptr<const DocumentSet>> sources,
                 std::vector<double> weights);
  int64_t size() const override { return static_cast<int64_t>(source_.size()); }
  void tokens(int64_t i, std::vector<int32_t>* out) const override;
  void trained_tokens(int64_t i, std::vector<int32_t>* ids,
                      std::vector<uint8_t>* trained) const override;
  int64_t vocab_size() const override;
  std::string vocab_source() const override { return sources_.front()->vocab_source(); }
  bool has_mask() const override;
  bool packed() const override { return sources_.front()->packed(); }
  // Which source document i of the mix comes from, and which of its documents.
  int64_t source_of(int64_t i) const { return source_[static_cast<size_t>(i)]; }
  int64_t document_of(int64_t i) const { return local_[static_cast<size_t>(i)]; }
  const std::vector<std::shared_ptr<const DocumentSet>>& sources() const { return sources_; }

 private:
  std::vector<std::shared_ptr<const DocumentSet>> sources_;
  std::vector<uint8_t> source_;
  std::vector<int64_t> local_;
};

// How conversations become training documents (sft.*; chat_dataset.h).
struct ChatOptions {
  bool train_on_prompt = false;          // train on every token, not only the assistant turns
  bool packing = true;                   // pack conversations into rows, or one (padded) per row
  std::string packing_strategy = "bfd";  // with packing: bfd or wrapped (chat_dataset.h)
  int64_t max_tokens = 0;  // the longest conversation kept whole (seq_len + 1); 0: no limit
  std::string truncation = "truncate";  // a longer one: truncate (keep its start) or drop
};

struct DatasetSpec {
  SourceOptions source;
  ChatOptions chat;  // for chat records (dataset chat, or auto on JSON lines of conversations)
  std::string tokenizer = "byte";           // for text sources
  std::shared_ptr<const Tokenizer> loaded;  // when set, used instead of loading `tokenizer`
  std::string index_dir;  // where text files' indexes are kept (text_corpus.h); "": nowhere
  // One weight per item of source.path (comma-separated or a TOML list), each item a source
  // of its own, mixed by MixedDocuments; empty: the items are read as one source.
  std::vector<double> weights;
};

// Opens the dataset the spec names: token shards when dataset is "tokens" or every file is a
// .bin shard; conversations (chat_dataset.h) when dataset is "chat", or "auto" and the first
// file is JSON lines (or a .json array) whose first record has "messages", or "prompt" and
// "completion"; else text read with read_documents and tokenized with spec.tokenizer. Logs one
// line with the document count and anything replaced or skipped. With weights, each item of the
// path is opened so and the items are mixed (MixedDocuments).
std::shared_ptr<const DocumentSet> open_dataset(const DatasetSpec& spec);

}  // namespace titan::data
