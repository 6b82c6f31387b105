#include "titan/data/dataset.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/log.h"
#include "titan/data/chat_dataset.h"

namespace titan::data {

void DocumentSet::trained_tokens(int64_t i, std::vector<int32_t>* ids,
                                 std::vector<uint8_t>* trained) const {
  const size_t n0 = ids->size();
  tokens(i, ids);
  trained->resize(trained->size() + (ids->size() - n0), 1);
}

TextDocuments::TextDocuments(std::vector<std::string> docs, std::shared_ptr<const Tokenizer> tok,
                             std::string section)
    : TextDocuments(std::make_shared<MemoryCorpus>(std::move(docs)), std::move(tok),
                    std::move(section)) {}

TextDocuments::TextDocuments(std::shared_ptr<const TextCorpus> corpus,
                             std::shared_ptr<const Tokenizer> tok, std::string section)
    : corpus_(std::move(corpus)), tok_(std::move(tok)), section_(std::move(section)) {}

void TextDocuments::tokens(int64_t i, std::vector<int32_t>* out) const {
  thread_local std::string text;
  corpus_->text(i, &text);
  tok_->encode(text, true, true, out);
}

std::string TextDocuments::vocab_source() const {
  return section_ + ".tokenizer '" + tok_->name() + "'";
}

TokenDocuments::TokenDocuments(std::vector<TokenShard> shards) : shards_(std::move(shards)) {
  starts_.push_back(0);
  for (const auto& s : shards_) {
    starts_.push_back(starts_.back() + s.num_documents());
    vocab_ = std::max(vocab_, s.vocab_size());
  }
}

void TokenDocuments::tokens(int64_t i, std::vector<int32_t>* out) const {
  const size_t k =
      static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) -
      1;
  const TokenShard& s = shards_[k];
  const int64_t d = i - starts_[k];
  for (uint32_t id : s.document(d)) {
    check(id < static_cast<uint64_t>(s.vocab_size()),
          s.path() + ": corrupt token shard (document " + std::to_string(d) + " holds id " +
              std::to_string(id) + ", past the vocabulary size " + std::to_string(s.vocab_size()) +
              ")");
    out->push_back(static_cast<int32_t>(id));
  }
}

std::string TokenDocuments::vocab_source() const {
  std::string first = shards_.empty() ? "" : shards_.front().path();
  return "the token shards ('" + first + "'" + (shards_.size() > 1 ? ", ..." : "") + ")";
}

std::shared_ptr<const DocumentSet> open_dataset(const DatasetSpec& spec) {
  const SourceOptions& o = spec.source;
  const std::string path = source_path(o);
  const std::vector<std::string> files = resolve_paths(path, o.section);
  // sft.* apply to conversations only: on training text or token shards they would do nothing.
  const auto no_sft = [&](const std::string& kind) {
    const ChatOptions d;
    const ChatOptions& c = spec.chat;
    const char* f = c.train_on_prompt != d.train_on_prompt ? "train_on_prompt"
                    : c.packing != d.packing               ? "packing"
                    : c.truncation != d.truncation         ? "truncation"
                                                           : nullptr;
    check(o.section != "dataloader" || f == nullptr,
          std::string("sft.") + (f ? f : "") + " has no effect: " + o.section + ".dataset_path '" +
              path + "' holds " + kind +
              ", not chat records; point it at chat JSON lines or leave sft.* out");
  };
  size_t shards = 0;
  for (const auto& f : files) shards += file_format(effective_dataset(o), f) == "tokens";
  if (shards > 0) {
    check(shards == files.size(), o.section + ".dataset_path '" + path +
                                      "' mixes token shards (.bin) with text files; use one kind");
    no_sft("token shards");
    std::vector<TokenShard> v;
    int64_t docs = 0, tokens = 0;
    for (const auto& f : files) {
      v.push_back(TokenShard::open(f));
      docs += v.back().num_documents();
      tokens += v.back().num_tokens();
    }
    check(docs > 0, "dataset 'tokens' at '" + path + "' has no documents; point " + o.section +
                        ".dataset_path at non-empty token shards");
    log::info(o.section + ": " + std::to_string(docs) + " pre-tokenized documents (" +
              std::to_string(tokens) + " tokens) in " + std::to_string(files.size()) +
              " shard(s) at " + path);
    return std::make_shared<TokenDocuments>(std::move(v));
  }
  std::shared_ptr<const Tokenizer> tok = spec.loaded ? spec.loaded : make_tokenizer(spec.tokenizer);
  if (effective_dataset(o) == "chat" || (effective_dataset(o) == "auto" && is_chat_file(files[0])))
    return open_chat_dataset(o, spec.chat, std::move(tok));
  no_sft("text");
  SourceStats st;
  std::shared_ptr<const TextCorpus> docs = open_text_corpus(o, spec.index_dir, &st);
  log::info(o.section + ": " + std::to_string(st.documents) + " documents in " +
            std::to_string(st.files) + " file(s) at " + path + ", tokenizer " + tok->name());
  const std::string problems = describe_problems(st, o.text_field);
  if (!problems.empty()) log::warn(o.section + ": " + problems);
  return std::make_shared<TextDocuments>(std::move(docs), std::move(tok), "dataloader");
}

}  // namespace titan::data
