#include "titan/data/packed_loader.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/rng.h"

namespace titan::data {

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
    ids_.clear();
    docs_->tokens(order_[cursor_++], &ids_);
    if (ids_.size() < 2) {
      ++empty_docs;
      continue;
    }
    // Compact consumed tokens before growing.
    if (head_ > 0 && in_.size() + ids_.size() > in_.capacity()) {
      in_.erase(in_.begin(), in_.begin() + static_cast<long>(head_));
      lab_.erase(lab_.begin(), lab_.begin() + static_cast<long>(head_));
      pos_.erase(pos_.begin(), pos_.begin() + static_cast<long>(head_));
      head_ = 0;
    }
    for (size_t i = 0; i + 1 < ids_.size(); ++i) {
      in_.push_back(ids_[i]);
      lab_.push_back(ids_[i + 1]);
      pos_.push_back(static_cast<int32_t>(static_cast<int64_t>(i) % opt_.seq_len));
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
      labels[r * opt_.seq_len + t] = -100;
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
          {"epoch", epoch_},
          {"cursor", cursor_},
          {"order", order_},
          {"input", tail(in_)},
          {"labels", tail(lab_)},
          {"positions", tail(pos_)}};
}

void PackedLoader::restore(const nlohmann::json& s) {
  check(s.value("version", 0) == 1, "dataloader state: unknown version");
  check(s.at("documents").get<int64_t>() == docs_->size() &&
            s.at("dp_world").get<int64_t>() == opt_.dp_world &&
            s.at("dp_rank").get<int64_t>() == opt_.dp_rank &&
            s.at("seq_len").get<int64_t>() == opt_.seq_len,
        "dataloader state was saved with another dataset, seq_len or data-parallel degree; "
        "resume with the same settings");
  epoch_ = s.at("epoch").get<int64_t>();
  cursor_ = s.at("cursor").get<int64_t>();
  order_ = s.at("order").get<std::vector<int64_t>>();
  in_ = s.at("input").get<std::vector<int32_t>>();
  lab_ = s.at("labels").get<std::vector<int32_t>>();
  pos_ = s.at("positions").get<std::vector<int32_t>>();
  head_ = 0;
  check(in_.size() == lab_.size() && in_.size() == pos_.size(), "dataloader state is corrupt");
}

}  // namespace titan::data
