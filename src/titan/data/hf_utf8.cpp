// UTF-8 validity, code points, Unicode White_Space and \w classes (utf8proc categories) and
// NFC normalization (utf8proc) for the Hugging Face tokenizer.
#include "titan/data/hf_utf8.h"

#include <utf8proc.h>

#include <cstdlib>

namespace titan::data::detail {

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = first_non_ascii(s, 0);
  while (i < s.size()) {
    if (p[i] < 0x80) {
      i = first_non_ascii(s, i);
      continue;
    }
    Utf8Step st = utf8_step(p + i, s.size() - i);
    if (!st.ok) return false;
    i += static_cast<size_t>(st.len);
  }
  return true;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> cps;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    Utf8Step st = utf8_step(p + i, s.size() - i);
    cps.push_back(st.ok ? st.cp : 0xFFFD);
    i += static_cast<size_t>(st.len);
  }
  return cps;
}

uint32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  Utf8Step st = utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
  return st.ok ? st.cp : 0xFFFD;
}
uint32_t first_code_point(std::string_view s) {
  Utf8Step st = utf8_step(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  return st.ok ? st.cp : 0xFFFD;
}

bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(uint32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
             (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
             (c >= 0x1F170 && c <= 0x1F189);
  }
}

// NFC: only the non-ASCII runs (each with the ASCII character before it, which may compose with
// following marks) go through utf8proc: an ASCII character is a starter that never composes
// with what precedes it, so normalization never crosses the boundary in front of one.
std::string_view nfc(std::string_view s, std::string* buf) {
  size_t i = first_non_ascii(s, 0);
  if (i == s.size()) return s;
  buf->clear();
  size_t done = 0;
  while (i < s.size()) {
    const size_t start = i > done ? i - 1 : i;
    size_t end = i;
    while (end < s.size() && static_cast<unsigned char>(s[end]) >= 0x80) ++end;
    buf->append(s.data() + done, start - done);
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t len =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + start),
                     static_cast<utf8proc_ssize_t>(end - start), &dst,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (len < 0) {
      buf->append(s.data() + start, end - start);  // cannot happen for valid UTF-8
    } else {
      buf->append(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
    }
    std::free(dst);
    done = end;
    i = first_non_ascii(s, end);
  }
  buf->append(s.data() + done, s.size() - done);
  return *buf;
}

std::string nfc_string(std::string_view s) {
  std::string buf;
  std::string_view v = nfc(s, &buf);
  return std::string(v);
}

}  // namespace titan::data::detail
