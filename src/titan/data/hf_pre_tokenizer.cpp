// Encoding up to BPE: added tokens split out of the raw text, NFC and the normalized added tokens,
// the Split pre-tokenizer steps and the ByteLevel step (prefix space, GPT-2 regex), word by word.
#include <string>
#include <string_view>

#include "titan/data/hf_added_tokens.h"
#include "titan/data/hf_bpe.h"
#include "titan/data/hf_regex.h"
#include "titan/data/hf_tokenizer_impl.h"
#include "titan/data/hf_utf8.h"

namespace titan::data {

using namespace detail;

template <class F>
void HfTokenizer::Impl::split_regex(const Regex& re, std::string_view s, F&& f) const {
  size_t prev = 0, start = 0, end = 0;
  while (prev < s.size() && re.find(s, prev, &start, &end)) {
    if (start > prev) f(s.substr(prev, start - prev));
    f(s.substr(start, end - start));
    prev = end;
  }
  if (prev < s.size()) f(s.substr(prev));
}

template <class F>
void HfTokenizer::Impl::split_step(const SplitStep& st, std::string_view s, F&& f) const {
  if (st.re.valid()) {
    split_regex(st.re, s, f);
    return;
  }
  size_t prev = 0;
  while (prev < s.size()) {
    size_t at = s.find(st.literal, prev);
    if (at == std::string_view::npos) break;
    if (at > prev) f(s.substr(prev, at - prev));
    f(s.substr(at, st.literal.size()));
    prev = at + st.literal.size();
  }
  if (prev < s.size()) f(s.substr(prev));
}

void HfTokenizer::Impl::encode_text(std::string_view text, Work& w) const {
  if (text.empty()) return;
  if (raw_set.empty()) {
    normalize_piece(text, w);
    return;
  }
  split_added(text, raw_set, [&](std::string_view piece, int32_t id) {
    if (id >= 0) {
      w.out->push_back(id);
    } else {
      normalize_piece(piece, w);
    }
  });
}

void HfTokenizer::Impl::normalize_piece(std::string_view piece, Work& w) const {
  std::string_view s = nfc ? detail::nfc(piece, &w.nfc_buf) : piece;
  if (normalized_set.empty()) {
    pre_tokenize(s, 0, w);
    return;
  }
  split_added(s, normalized_set, [&](std::string_view sub, int32_t id) {
    if (id >= 0) {
      w.out->push_back(id);
    } else {
      pre_tokenize(sub, 0, w);
    }
  });
}

void HfTokenizer::Impl::pre_tokenize(std::string_view piece, size_t step, Work& w) const {
  if (step == splits.size()) {
    byte_level_piece(piece, w);
    return;
  }
  split_step(splits[step], piece, [&](std::string_view sub) { pre_tokenize(sub, step + 1, w); });
}

void HfTokenizer::Impl::byte_level_piece(std::string_view piece, Work& w) const {
  std::string_view word = piece;
  if (prefix_space && piece[0] != ' ') {
    w.word_buf.assign(1, ' ');
    w.word_buf.append(piece);
    word = w.word_buf;
  }
  if (byte_level_re.valid()) {
    split_regex(byte_level_re, word, [&](std::string_view sub) { bpe(sub, w); });
  } else {
    bpe(word, w);
  }
}

}  // namespace titan::data
