// Added tokens of the Hugging Face tokenizer: their flags, a leftmost-longest literal matcher
// over them, and tokenizers' AddedVocabulary::find_matches splitting of text around them.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/data/hf_utf8.h"

namespace titan::data::detail {

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  bool operator==(const AddedToken&) const = default;
};

// Leftmost-longest search over a set of literal strings (aho-corasick's LeftmostLongest).
class LiteralSet {
 public:
  struct Entry {
    std::string text;
    int32_t id;
    AddedToken flags;
  };
  void build(std::vector<Entry> entries) {
    entries_ = std::move(entries);
    // Longest first (std::sort: stable_sort's temporary buffer trips ASan with GCC 12).
    std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      return a.text.size() != b.text.size() ? a.text.size() > b.text.size() : a.text < b.text;
    });
    for (auto& l : by_first_) l.clear();
    first_.fill(0);
    int distinct = 0;
    for (size_t k = 0; k < entries_.size(); ++k) {
      const auto b = static_cast<unsigned char>(entries_[k].text[0]);
      if (!first_[b]) ++distinct;
      first_[b] = 1;
      by_first_[b].push_back(static_cast<int>(k));
      only_first_ = static_cast<int>(b);
    }
    if (distinct != 1) only_first_ = -1;
  }
  bool empty() const { return entries_.empty(); }
  bool find(std::string_view s, size_t from, size_t* pos, const Entry** hit) const {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    for (size_t i = from; i < n; ++i) {
      if (only_first_ >= 0) {
        const void* q = std::memchr(p + i, only_first_, n - i);
        if (!q) return false;
        i = static_cast<size_t>(static_cast<const unsigned char*>(q) - p);
      } else if (!first_[p[i]]) {
        continue;
      }
      for (int k : by_first_[p[i]]) {
        const std::string& t = entries_[static_cast<size_t>(k)].text;
        if (t.size() <= n - i && std::memcmp(p + i, t.data(), t.size()) == 0) {
          *pos = i;
          *hit = &entries_[static_cast<size_t>(k)];
          return true;
        }
      }
    }
    return false;
  }

 private:
  std::vector<Entry> entries_;
  std::array<uint8_t, 256> first_{};
  std::array<std::vector<int>, 256> by_first_;
  int only_first_ = -1;
};

// tokenizers' AddedVocabulary::find_matches: calls f(piece, id) for every piece of s in order,
// id = -1 for text between added tokens (possibly empty pieces are skipped).
template <class F>
void split_added(std::string_view s, const LiteralSet& set, F&& f) {
  const size_t n = s.size();
  size_t start_offset = 0, search = 0, start = 0;
  const LiteralSet::Entry* hit = nullptr;
  while (search < n && set.find(s, search, &start, &hit)) {
    size_t stop = start + hit->text.size();
    search = stop;
    const AddedToken& t = hit->flags;
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      const bool stop_space = stop == n || !is_word_char(first_code_point(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        if (!is_white_space(first_code_point(s.substr(k, b - k)))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (t.rstrip) {
      while (stop < n) {
        Utf8Step st = utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + stop, n - stop);
        if (!st.ok || !is_white_space(st.cp)) break;
        stop += static_cast<size_t>(st.len);
      }
    }
    if (start_offset < start) f(s.substr(start_offset, start - start_offset), -1);
    f(s.substr(start, stop - start), hit->id);
    start_offset = stop;
  }
  if (start_offset < n) f(s.substr(start_offset), -1);
}

}  // namespace titan::data::detail
