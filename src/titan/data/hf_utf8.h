// UTF-8 and Unicode helpers of the Hugging Face tokenizer (hf_tokenizer.h): decoding steps that
// consume maximal invalid subparts, code points, Oniguruma's \s and Rust regex's \w, and NFC.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data::detail {

struct Utf8Step {
  int len;  // bytes consumed: the character, or the maximal invalid subpart
  bool ok;
  uint32_t cp;
};

// One step of a UTF-8 decoder that, on error, consumes the maximal subpart of an ill-formed
// sequence (Unicode's recommended practice, which Python's errors="replace" follows).
inline Utf8Step utf8_step(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return {1, true, c};
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {1, false, 0};
  }
  size_t i = 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= n) return {static_cast<int>(i), false, 0};
    const unsigned b = p[i];
    if (b < lo || b > hi) return {static_cast<int>(i), false, 0};
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {need + 1, true, cp};
}

// Index of the first byte >= 0x80 in s at or after from; s.size() when there is none.
inline size_t first_non_ascii(std::string_view s, size_t from) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = from;
  const size_t n = s.size();
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w & 0x8080808080808080ull) break;
  }
  for (; i < n; ++i)
    if (p[i] >= 0x80) return i;
  return n;
}

// True when s is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

// Appends cp to *out as UTF-8.
void append_utf8(std::string* out, uint32_t cp);

// Code points of valid UTF-8 text.
std::vector<uint32_t> code_points(std::string_view s);

// Last / first code point of valid UTF-8 text (s non-empty).
uint32_t last_code_point(std::string_view s);
uint32_t first_code_point(std::string_view s);

// Unicode White_Space: what Oniguruma's and Rust regex's \s match.
bool is_white_space(uint32_t c);

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(uint32_t c);

// NFC of valid UTF-8 text. Returns s itself when it is ASCII; otherwise *buf holds the result.
std::string_view nfc(std::string_view s, std::string* buf);

// nfc(s) as a string of its own.
std::string nfc_string(std::string_view s);

}  // namespace titan::data::detail
