#include "titan/data/packed_loader.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "titan/core/error.h"
#include "titan/core/rng.h"

namespace titan::data {
namespace {
constexpr int32_t kUntrained = -100;  // the label of an id the loss skips
}  // namespace

PackedLoader::PackedLoader(std::shared_ptr<const DocumentSet> docs, const LoaderOptions& opt)
    : docs_(std::move(docs)), opt_(opt) {
  check(opt.dp_world > 0 && opt.dp_rank >= 0 && opt.dp_rank < opt.dp_world,
        "data-parallel rank out of range");
  for (int64_t i = opt.dp_rank; i < docs_->size(); i += opt.dp_world) order_.push_back(i);
  check(!order_.empty(), "data-parallel rank " + std::to_string(opt.dp_rank) +
                             " has no documents; the dataset is smaller than the number of ranks");
  const size_t want = static_cast<size_t>(opt.batch * opt.seq_len) * 2 + 65536;
  in_.reserve(want);
  lab_.reserve(want);
  pos_.reserve(want);
}

PackedLoader::PackedLoader(std::vector<std::string> docs, const ByteTokenizer& /*tok*/,
                           const LoaderOptions& opt)
    : PackedLoader(std::make_shared<TextDocuments>(std::move(docs), make_tokenizer("byte")), opt) {}

void PackedLoader::refill() {
  const int64_t row_tokens = opt_.batch * opt_.seq_len;
  int64_t empty_docs = 0;
  while (!exhausted_ && static_cast<int64_t>(in_.size() - head_) < row_tokens) {
    if (cursor_ == static_cast<int64_t>(order_.size())) {
      if (!opt_.repeat) {
        exhausted_ = true;
        break;
      }
      check(empty_docs < static_cast<int64_t>(order_.size()),
            "every document is empty after tokenization; check the dataset");
      cursor_ = 0;
      ++epoch_;
      empty_docs = 0;
      if (opt_.shuffle) {  // Fisher-Yates with a counter-based stream per epoch
        for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
          uint64_t r =
              random_u64(opt_.seed, static_cast<uint64_t>(epoch_), static_cast<uint64_t>(i));
          std::swap(order_[i], order_[static_cast<int64_t>(r % static_cast<uint64_t>(i + 1))]);
        }
      }
    }
    // A document, or (best-fit packing) the parts of one row, each from position 0.
    const int64_t doc = order_[cursor_++];
    const bool packed = docs_->packed();
    const int64_t parts = packed ? 1 : docs_->parts(doc);
    int64_t filled = 0;    // this row's input positions so far (one document per row)
    int32_t next_pos = 0;  // the position after the last part's last
    for (int64_t k = 0; k < parts; ++k) {
      ids_.clear();
      trained_.clear();
      if (!packed)
        docs_->part_tokens(doc, k, &ids_, &trained_);
      else if (docs_->has_mask())
        docs_->trained_tokens(doc, &ids_, &trained_);
      else
        docs_->tokens(doc, &ids_);
      if (ids_.size() < 2 || filled == opt_.seq_len) continue;
      // Compact consumed tokens before growing.
      if (head_ > 0 && in_.size() + ids_.size() > in_.capacity()) {
        in_.erase(in_.begin(), in_.begin() + static_cast<long>(head_));
        lab_.erase(lab_.begin(), lab_.begin() + static_cast<long>(head_));
        pos_.erase(pos_.begin(), pos_.begin() + static_cast<long>(head_));
        head_ = 0;
      }
      const bool masked = docs_->has_mask() && !trained_.empty();
      const size_t pairs =
          packed ? ids_.size() - 1
                 : std::min(ids_.size() - 1, static_cast<size_t>(opt_.seq_len - filled));
      for (size_t i = 0; i < pairs; ++i) {
        in_.push_back(ids_[i]);
        lab_.push_back(masked && trained_[i + 1] == 0 ? kUntrained : ids_[i + 1]);
        pos_.push_back(static_cast<int32_t>(static_cast<int64_t>(i) % opt_.seq_len));
      }
      filled += static_cast<int64_t>(pairs);
      next_pos = static_cast<int32_t>(pairs);
    }
    if (filled == 0) {
      ++empty_docs;
      continue;
    }
    // One document per row: the rest of its row is padding, positions counting on (causal).
    for (int64_t i = packed ? opt_.seq_len : filled; i < opt_.seq_len; ++i) {
      in_.push_back(0);
      lab_.push_back(kUntrained);
      pos_.push_back(next_pos++);
    }
  }
}

int64_t PackedLoader::next(int32_t* input, int32_t* labels, int32_t* positions) {
  refill();
  const int64_t rows =
      std::min(opt_.batch, static_cast<int64_t>(in_.size() - head_) / opt_.seq_len);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = head_ + static_cast<size_t>(r * opt_.seq_len);
    int32_t rebase = pos_[base];
    for (int64_t t = 0; t < opt_.seq_len; ++t) {
      const size_t k = base + static_cast<size_t>(t);
      if (t > 0 && pos_[k] == 0) rebase = 0;  // the first full document starts here
      input[r * opt_.seq_len + t] = in_[k];
      labels[r * opt_.seq_len + t] = lab_[k];
      positions[r * opt_.seq_len + t] = pos_[k] - rebase;
    }
  }
  for (int64_t r = rows; r < opt_.batch; ++r) {  // padding rows (single pass only)
    for (int64_t t = 0; t < opt_.seq_len; ++t) {
      input[r * opt_.seq_len + t] = 0;
      labels[r * opt_.seq_len + t] = kUntrained;
      positions[r * opt_.seq_len + t] = static_cast<int32_t>(t);
    }
  }
  head_ += static_cast<size_t>(rows * opt_.seq_len);
  return rows;
}

nlohmann::json PackedLoader::state() const {
  auto tail = [&](const std::vector<int32_t>& v) {
    return std::vector<int32_t>(v.begin() + static_cast<long>(head_), v.end());
  };
  return {{"version", 1},
          {"documents", docs_->size()},
          {"dp_rank", opt_.dp_rank},
          {"dp_world", opt_.dp_world},
          {"seq_len", opt_.seq_len},
          {"packed", docs_->packed()},
          {"epoch", epoch_},
          {"cursor", cursor_},
          {"order", order_},
          {"input", tail(in_)},
          {"labels", tail(lab_)},
          {"positions", tail(pos_)}};
}

namespace {

using nlohmann::json;

// s[key] as an integer; titan::Error naming the field when absent or of another type.
int64_t int_field(const json& s, const char* key) {
  check(s.contains(key), std::string("dataloader state lacks \"") + key + "\"");
  const json& v = s[key];
  const bool ok = v.is_number_integer() &&
                  (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
  check(ok, std::string("dataloader state: \"") + key + "\" must be an integer, got " +
                v.dump().substr(0, 40));
  return v.get<int64_t>();
}

// s[key] as integers in [lo, hi).
std::vector<int64_t> int_array(const json& s, const char* key, int64_t lo, int64_t hi) {
  check(s.contains(key), std::string("dataloader state lacks \"") + key + "\"");
  const json& a = s[key];
  check(a.is_array(), std::string("dataloader state: \"") + key + "\" must be an array");
  std::vector<int64_t> r;
  r.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const json& v = a[i];
    const bool integer = v.is_number_integer() &&
                         (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{INT64_MAX});
    const int64_t x = integer ? v.get<int64_t>() : 0;
    check(integer && x >= lo && x < hi, std::string("dataloader state: \"") + key + "\"[" +
                                            std::to_string(i) + "] is " + v.dump().substr(0, 40) +
                                            ", outside [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + ")");
    r.push_back(x);
  }
  return r;
}

std::vector<int32_t> narrow(const std::vector<int64_t>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

}  // namespace

void PackedLoader::restore(const nlohmann::json& s) {
  // Everything is checked before anything changes: a position outside this dataset would read
  // out of bounds (order, cursor) or feed ids past the vocabulary or the RoPE table.
  check(s.is_object(), "dataloader state must be a JSON object");
  check(int_field(s, "version") == 1, "dataloader state: unknown \"version\" (expected 1)");
  const int64_t docs = int_field(s, "documents");
  check(docs == docs_->size(), "dataloader state is for a dataset of " + std::to_string(docs) +
                                   " documents, this one has " + std::to_string(docs_->size()) +
                                   "; resume with the same dataset");
  const int64_t world = int_field(s, "dp_world"), rank = int_field(s, "dp_rank");
  check(world == opt_.dp_world && rank == opt_.dp_rank,
        "dataloader state is for data-parallel rank " + std::to_string(rank) + " of " +
            std::to_string(world) + ", this run is rank " + std::to_string(opt_.dp_rank) + " of " +
            std::to_string(opt_.dp_world) + "; resume with the same degree");
  const int64_t seq = int_field(s, "seq_len");
  check(seq == opt_.seq_len, "dataloader state was saved with training.seq_len " +
                                 std::to_string(seq) + ", this run has " +
                                 std::to_string(opt_.seq_len) + "; resume with the same seq_len");
  // Absent in an older titan's state: those always packed.
  const bool packed = !s.contains("packed") || s["packed"] == true;
  check(!s.contains("packed") || s["packed"].is_boolean(),
        "dataloader state: \"packed\" must be true or false");
  check(packed == docs_->packed(), std::string("dataloader state was saved with sft.packing ") +
                                       (packed ? "true" : "false") + ", this run has " +
                                       (docs_->packed() ? "true" : "false") +
                                       "; resume with the same packing");
  const int64_t epoch = int_field(s, "epoch");
  check(epoch >= 0, "dataloader state: \"epoch\" is negative");

  // The order must be a permutation of this rank's documents.
  std::vector<int64_t> order = int_array(s, "order", 0, docs);
  int64_t mine = 0;
  for (int64_t i = opt_.dp_rank; i < docs; i += opt_.dp_world) ++mine;
  check(static_cast<int64_t>(order.size()) == mine,
        "dataloader state: \"order\" lists " + std::to_string(order.size()) +
            " documents, this rank has " + std::to_string(mine));
  std::vector<bool> seen(static_cast<size_t>(docs), false);
  for (int64_t d : order) {
    check(d % opt_.dp_world == opt_.dp_rank && !seen[static_cast<size_t>(d)],
          "dataloader state: \"order\" is not a permutation of this rank's documents (document " +
              std::to_string(d) + ")");
    seen[static_cast<size_t>(d)] = true;
  }
  const int64_t cursor = int_field(s, "cursor");
  check(cursor >= 0 && cursor <= mine, "dataloader state: \"cursor\" " + std::to_string(cursor) +
                                           " is outside [0, " + std::to_string(mine) + "]");

  // The pending tokens: ids within the vocabulary, positions counting up from 0 within a
  // document (what refill() produces), so next() never computes a negative position.
  const int64_t vocab = docs_->vocab_size();
  std::vector<int64_t> in = int_array(s, "input", 0, vocab);
  std::vector<int64_t> lab = int_array(s, "labels", kUntrained, vocab);
  for (size_t i = 0; i < lab.size(); ++i)
    check(lab[i] >= 0 || lab[i] == kUntrained,
          "dataloader state: \"labels\"[" + std::to_string(i) + "] is " + std::to_string(lab[i]) +
              ", outside [0, " + std::to_string(vocab) + ") and not -100 (an untrained label)");
  std::vector<int64_t> pos = int_array(s, "positions", 0, opt_.seq_len);
  check(in.size() == lab.size() && in.size() == pos.size(),
        "dataloader state: \"input\", \"labels\" and \"positions\" differ in length (" +
            std::to_string(in.size()) + ", " + std::to_string(lab.size()) + ", " +
            std::to_string(pos.size()) + ")");
  for (size_t i = 1; i < pos.size(); ++i)
    check(pos[i] == 0 || pos[i] == pos[i - 1] + 1,
          "dataloader state: \"positions\"[" + std::to_string(i) + "] is " +
              std::to_string(pos[i]) + " after " + std::to_string(pos[i - 1]) +
              "; positions count up from 0 within a document");
  check(packed || pos.size() % static_cast<size_t>(opt_.seq_len) == 0,
        "dataloader state: " + std::to_string(pos.size()) +
            " pending tokens are not whole rows of training.seq_len " +
            std::to_string(opt_.seq_len) + " (sft.packing false gives each document its own row)");
  for (size_t i = 0; !packed && i < pos.size(); i += static_cast<size_t>(opt_.seq_len))
    check(pos[i] == 0, "dataloader state: \"positions\"[" + std::to_string(i) +
                           "] starts a row (sft.packing false) but is " + std::to_string(pos[i]));

  epoch_ = epoch;
  cursor_ = cursor;
  order_ = std::move(order);
  in_ = narrow(in);
  lab_ = narrow(lab);
  pos_ = narrow(pos);
  head_ = 0;
  exhausted_ = false;
}

}  // namespace titan::data
