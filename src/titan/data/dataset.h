// The documents a loader reads, as token ids: text documents tokenized on the fly, or
// pre-tokenized shards (token_shard.h) that give the same ids without the tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
};

class TextDocuments final : public DocumentSet {
 public:
  TextDocuments(std::vector<std::string> docs, std::shared_ptr<const Tokenizer> tok,
                std::string section = "dataloader");
  int64_t size() const override { return static_cast<int64_t>(docs_.size()); }
  void tokens(int64_t i, std::vector<int32_t>* out) const override;
  int64_t vocab_size() const override { return tok_->vocab_size(); }
  std::string vocab_source() const override;
  const std::shared_ptr<const Tokenizer>& tokenizer() const { return tok_; }

 private:
  std::vector<std::string> docs_;
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

struct DatasetSpec {
  SourceOptions source;
  std::string tokenizer = "byte";           // for text sources
  std::shared_ptr<const Tokenizer> loaded;  // when set, used instead of loading `tokenizer`
};

// Opens the dataset the spec names: token shards when dataset is "tokens" or every file is a
// .bin shard, else text read with read_documents and tokenized with spec.tokenizer. Logs one line
// with the document count and anything replaced or skipped.
std::shared_ptr<const DocumentSet> open_dataset(const DatasetSpec& spec);

}  // namespace titan::data
