#include "titan/data/packed_loader.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/core/rng.h"

namespace titan::data {

PackedLoader::PackedLoader(std::vector<std::string> docs, const ByteTokenizer& tok,
                           const LoaderOptions& opt)
    : docs_(std::move(docs)), tok_(tok), opt_(opt) {
  check(opt.dp_world > 0 && opt.dp_rank >= 0 && opt.dp_rank < opt.dp_world,
        "data-parallel rank out of range");
  for (int64_t i = opt.dp_rank; i < static_cast<int64_t>(docs_.size()); i += opt.dp_world)
    order_.push_back(i);
  check(!order_.empty(), "data-parallel rank " + std::to_string(opt.dp_rank) +
                             " has no documents; the dataset is smaller than the number of ranks");
  const size_t want = static_cast<size_t>(opt.batch * opt.seq_len) * 2 + 65536;
  in_.reserve(want);
  lab_.reserve(want);
  pos_.reserve(want);
}

void PackedLoader::refill() {
  const int64_t row_tokens = opt_.batch * opt_.seq_len;
  int64_t empty_docs = 0;
  while (static_cast<int64_t>(in_.size() - head_) < row_tokens) {
    if (cursor_ == static_cast<int64_t>(order_.size())) {
      check(empty_docs < static_cast<int64_t>(order_.size()),
            "every document is empty after tokenization; check the dataset");
      cursor_ = 0;
      ++epoch_;
      empty_docs = 0;
      if (opt_.shuffle) {  // Fisher-Yates with a counter-based stream per epoch
        for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
          uint64_t r = random_u64(opt_.seed, static_cast<uint64_t>(epoch_), static_cast<uint64_t>(i));
          std::swap(order_[i], order_[static_cast<int64_t>(r % static_cast<uint64_t>(i + 1))]);
        }
      }
    }
    ids_.clear();
    tok_.encode(docs_[order_[cursor_++]], true, true, &ids_);
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

void PackedLoader::next(int32_t* input, int32_t* labels, int32_t* positions) {
  refill();
  for (int64_t r = 0; r < opt_.batch; ++r) {
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
  head_ += static_cast<size_t>(opt_.batch * opt_.seq_len);
}

}  // namespace titan::data
