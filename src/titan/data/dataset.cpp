#include "titan/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

MixedDocuments::MixedDocuments(std::vector<std::shared_ptr<const DocumentSet>> sources,
                               std::vector<double> weights)
    : sources_(std::move(sources)) {
  check(!sources_.empty() && sources_.size() == weights.size() && sources_.size() <= 255,
        "a mix needs one weight per source (at most 255 sources)");
  double total = 0;
  for (double w : weights) total += w;
  int64_t n = 0;
  for (size_t s = 0; s < sources_.size(); ++s) {
    weights[s] /= total;
    check(sources_[s]->packed() == sources_[0]->packed(),
          "mixed sources must all be packed or all one document per row (sft.packing)");
    n = std::max(
        n, static_cast<int64_t>(std::ceil(static_cast<double>(sources_[s]->size()) / weights[s])));
  }
  // Smooth weighted round-robin: each turn every source gains its weight, the one ahead is
  // picked and pays back 1.
  std::vector<double> credit(sources_.size(), 0.0);
  std::vector<int64_t> taken(sources_.size(), 0);
  source_.resize(static_cast<size_t>(n));
  local_.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    size_t best = 0;
    for (size_t s = 0; s < credit.size(); ++s) {
      credit[s] += weights[s];
      if (credit[s] > credit[best]) best = s;
    }
    credit[best] -= 1.0;
    source_[static_cast<size_t>(j)] = static_cast<uint8_t>(best);
    local_[static_cast<size_t>(j)] = taken[best]++ % sources_[best]->size();
  }
}

void MixedDocuments::tokens(int64_t i, std::vector<int32_t>* out) const {
  sources_[source_[static_cast<size_t>(i)]]->tokens(local_[static_cast<size_t>(i)], out);
}

void MixedDocuments::trained_tokens(int64_t i, std::vector<int32_t>* ids,
                                    std::vector<uint8_t>* trained) const {
  sources_[source_[static_cast<size_t>(i)]]->trained_tokens(local_[static_cast<size_t>(i)], ids,
                                                            trained);
}

int64_t MixedDocuments::vocab_size() const {
  int64_t v = 0;
  for (const auto& s : sources_) v = std::max(v, s->vocab_size());
  return v;
}

bool MixedDocuments::has_mask() const {
  for (const auto& s : sources_)
    if (s->has_mask()) return true;
  return false;
}

namespace {
std::shared_ptr<const DocumentSet> open_one(const DatasetSpec& spec);
}  // namespace

std::shared_ptr<const DocumentSet> open_dataset(const DatasetSpec& spec) {
  if (spec.weights.empty()) return open_one(spec);
  const SourceOptions& o = spec.source;
  const std::vector<std::string> items = path_items(source_path(o));
  check(items.size() == spec.weights.size(),
        o.section + ".dataset_weights has " + std::to_string(spec.weights.size()) +
            " weight(s) but " + o.section + ".dataset_path names " + std::to_string(items.size()) +
            " source(s); give one weight per source");
  std::vector<std::shared_ptr<const DocumentSet>> sources;
  DatasetSpec one = spec;
  one.weights.clear();
  for (const auto& item : items) {
    one.source.path = item;
    sources.push_back(open_one(one));
    if (!one.loaded) {
      if (auto* t = dynamic_cast<const TextDocuments*>(sources.back().get()))
        one.loaded = t->tokenizer();  // load the tokenizer once
    }
  }
  auto mix = std::make_shared<MixedDocuments>(std::move(sources), spec.weights);
  std::string shares;
  double total = 0;
  for (double w : spec.weights) total += w;
  for (size_t s = 0; s < items.size(); ++s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * spec.weights[s] / total);
    shares += std::string(s ? ", " : "") + b + " " + items[s];
  }
  log::info(o.section + ": mixing " + std::to_string(items.size()) + " sources by weight, " +
            std::to_string(mix->size()) + " documents per epoch: " + shares);
  return mix;
}

namespace {
std::shared_ptr<const DocumentSet> open_one(const DatasetSpec& spec) {
  const SourceOptions& o = spec.source;
  const std::string path = source_path(o);
  const std::vector<std::string> files = resolve_paths(path, o.section);
  // sft.* apply to conversations only: on training text or token shards they would do nothing.
  const auto no_sft = [&](const std::string& kind) {
    const ChatOptions d;
    const ChatOptions& c = spec.chat;
    const char* f = c.train_on_prompt != d.train_on_prompt     ? "train_on_prompt"
                    : c.packing != d.packing                   ? "packing"
                    : c.truncation != d.truncation             ? "truncation"
                    : c.packing_strategy != d.packing_strategy ? "packing_strategy"
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
}  // namespace

}  // namespace titan::data
