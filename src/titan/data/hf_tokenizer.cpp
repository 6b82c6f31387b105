#include "titan/data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "titan/core/error.h"

namespace titan::data {
namespace {
namespace fs = std::filesystem;
// Token ids must be below this (2^24): the id-indexed decoder tables stay under a gigabyte.
constexpr uint64_t kMaxTokenIds = uint64_t{1} << 24;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// UTF-8

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

// Code points of valid UTF-8 text.
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

// Last / first code point of valid UTF-8 text (s non-empty).
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

// Unicode White_Space: what Oniguruma's and Rust regex's \s match.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
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

// NFC of valid UTF-8 text. Returns s itself when it is ASCII; otherwise *buf holds the result.
// Only the non-ASCII runs (each with the ASCII character before it, which may compose with
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

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2's bytes_to_unicode).

struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
  // The raw bytes a byte-level token string stands for; false if it holds other characters.
  bool to_bytes(std::string_view token, std::string* bytes) const {
    bytes->clear();
    for (uint32_t cp : code_points(token)) {
      auto it = cp_to_byte.find(cp);
      if (it == cp_to_byte.end()) return false;
      bytes->push_back(static_cast<char>(it->second));
    }
    return true;
  }
};

const ByteLevelAlphabet& byte_level() {
  static const ByteLevelAlphabet a;
  return a;
}

// ---------------------------------------------------------------------------------------------
// Regexes. tokenizer.json patterns are Oniguruma syntax; the library's Oniguruma has newer
// Unicode tables than PCRE2 10.42 and its \s is Unicode White_Space (PCRE2's also holds
// U+180E). \p{L}, \p{N}, \s and \S are rewritten into classes matching Oniguruma exactly.

constexpr const char* kWhiteSpaceClass =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";
// Letters and numbers of Unicode 15-16 that PCRE2 10.42 (Unicode 14) does not know.
constexpr const char* kExtraLetters =
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}"
    "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}"
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}"
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
constexpr const char* kExtraNumbers =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";

std::string onig_to_pcre2(std::string_view p, const std::string& where) {
  std::string out;
  bool in_class = false;
  size_t body = 0;  // index where the current class body starts
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      const bool letter_or_number =
          (e == 'p' || e == 'P') && (p.substr(i + 2, 3) == "{L}" || p.substr(i + 2, 3) == "{N}");
      if (letter_or_number && e == 'P' && in_class) {
        out.append(p.substr(i, 5));  // approximation: PCRE2's own tables
        i += 4;
        continue;
      }
      if (letter_or_number) {
        if (!in_class) out.append(e == 'p' ? "[" : "[^");
        out.append("\\p{").push_back(p[i + 3]);
        out.append("}").append(p[i + 3] == 'L' ? kExtraLetters : kExtraNumbers);
        if (!in_class) out.append("]");
        i += 4;
        continue;
      }
      if (e == 's' || e == 'S') {
        if (e == 'S' && in_class) {
          out.append("\\S\\x{180E}");  // PCRE2's \s also holds U+180E, Oniguruma's does not
        } else {
          if (!in_class) out.append(e == 's' ? "[" : "[^");
          out.append(kWhiteSpaceClass);
          if (!in_class) out.append("]");
        }
        ++i;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (in_class) {
      if (c == ']' && i > body) {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
          size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) throw Error(where + ": unterminated [: in regex");
          out += p.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
        throw Error(where + ": nested character classes are not supported in the regex");
      }
      out += c;
      continue;
    }
    out += c;
    if (c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      body = i + 1;
    }
  }
  return out;
}

// A compiled PCRE2 pattern (UTF + UCP, JIT when available).
class Regex {
 public:
  Regex() = default;
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error(where + ": cannot compile regex at offset " + std::to_string(off) + ": " +
                  reinterpret_cast<const char*>(msg));
    }
    uint32_t min_len = 0;
    pcre2_pattern_info(code_, PCRE2_INFO_MINLENGTH, &min_len);
    if (min_len == 0) {
      pcre2_code_free(code_);
      code_ = nullptr;
      throw Error(where + ": the regex can match the empty string, which is not supported");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  Regex(Regex&& o) noexcept : code_(o.code_), jit_(o.jit_) { o.code_ = nullptr; }
  Regex& operator=(Regex&& o) noexcept {
    std::swap(code_, o.code_);
    std::swap(jit_, o.jit_);
    return *this;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }
  bool valid() const { return code_ != nullptr; }

  // Next match in s at or after `from` (s is valid UTF-8). False when there is none.
  bool find(std::string_view s, size_t from, size_t* start, size_t* end) const;

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// Per-thread PCRE2 match data and JIT stack (pattern independent).
struct PcreScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  PcreScratch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!md || !mc || !js) throw std::bad_alloc();
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~PcreScratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }
  PcreScratch(const PcreScratch&) = delete;
  PcreScratch& operator=(const PcreScratch&) = delete;
};

PcreScratch& pcre_scratch() {
  thread_local PcreScratch s;
  return s;
}

bool Regex::find(std::string_view s, size_t from, size_t* start, size_t* end) const {
  PcreScratch& sc = pcre_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK, sc.md, sc.mc)
                : pcre2_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK, sc.md, sc.mc);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    throw Error(std::string("tokenizer pre-tokenizer regex failed: ") +
                reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
  *start = ov[0];
  *end = ov[1];
  return true;
}

// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// Added tokens

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

// ---------------------------------------------------------------------------------------------
// BPE merges: (left id, right id) -> (rank, merged id), open addressing.

class MergeTable {
 public:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t id = 0;
  };
  void reserve(size_t n) {
    int bits = 4;
    while ((size_t{1} << bits) < n + n / 2 + 16) ++bits;  // load <= 2/3
    shift_ = 64 - bits;
    slots_.assign(size_t{1} << bits, Slot{});
  }
  // Later entries for the same pair replace earlier ones (as a Rust HashMap collect).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
    const uint64_t k = key(a, b);
    size_t i = index(k);
    const size_t mask = slots_.size() - 1;
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask;
    slots_[i] = Slot{k, rank, id};
  }
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    size_t i = index(k);
    const size_t mask = slots_.size() - 1;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t index(uint64_t k) const {
    return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<Slot> slots_;
  int shift_ = 60;
};

// ---------------------------------------------------------------------------------------------
// BPE word cache: per thread (no locks, no sharing), 2 MiB, 2-way set associative, one 64-byte line
// per word: the word's bytes and its ids inline. Words over 22 bytes or 8 ids are not cached.

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    uint64_t v = 0;
    std::memcpy(&v, s.data() + i, s.size() - i);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return h | 1;  // 0 marks an empty slot
}

class WordCache {
 public:
  static constexpr size_t kMaxBytes = 22, kMaxIds = 8;
  WordCache() : entries_(2 * kSets) {}
  bool find(uint64_t h, std::string_view w, std::vector<int32_t>* out) const {
    const Entry* set = &entries_[2 * (h & (kSets - 1))];
    for (int k = 0; k < 2; ++k) {
      const Entry& e = set[k];
      if (e.hash == h && e.len == w.size() && std::memcmp(e.key, w.data(), w.size()) == 0) {
        out->insert(out->end(), e.ids, e.ids + e.n);
        return true;
      }
    }
    return false;
  }
  void insert(uint64_t h, std::string_view w, const std::vector<int32_t>& ids) {
    Entry* set = &entries_[2 * (h & (kSets - 1))];
    set[1] = set[0];  // the newest entry stays in way 0
    Entry& e = set[0];
    e.hash = h;
    e.len = static_cast<uint8_t>(w.size());
    e.n = static_cast<uint8_t>(ids.size());
    std::memcpy(e.key, w.data(), w.size());
    std::copy(ids.begin(), ids.end(), e.ids);
  }

 private:
  static constexpr size_t kSets = size_t{1} << 14;  // 32768 words, 2 MiB
  struct alignas(64) Entry {
    uint64_t hash = 0;
    uint8_t len = 0, n = 0;
    char key[kMaxBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64);
  std::vector<Entry> entries_;
};

// This thread's cache for the tokenizer with the given (never reused) instance id; a thread
// keeps caches for its 4 most recently used tokenizers.
WordCache& thread_word_cache(uint64_t owner) {
  thread_local std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> caches;
  for (auto& [o, c] : caches)
    if (o == owner) return *c;
  if (caches.size() >= 4) caches.erase(caches.begin());
  caches.emplace_back(owner, std::make_unique<WordCache>());
  return *caches.back().second;
}

std::atomic<uint64_t> g_next_instance{1};

constexpr size_t kSmallWord = 48;  // words up to this many symbols merge by linear scans

// Scratch for one encode call.
struct Work {
  std::vector<int32_t>* out = nullptr;
  WordCache* cache = nullptr;
  std::string nfc_buf, word_buf;
  std::vector<int32_t> sym, rank, merged;
  struct Node {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Node> nodes;
  struct HeapItem {
    int32_t rank, pos, id;
  };
  std::vector<HeapItem> heap;
};

// ---------------------------------------------------------------------------------------------
// JSON helpers

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error("cannot read tokenizer file " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// j[key], or null when absent (without copying).
const json& member(const json& j, const char* key) {
  static const json null_json;
  if (!j.is_object()) return null_json;
  auto it = j.find(key);
  return it == j.end() ? null_json : *it;
}

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool def, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) throw Error(where + "." + key + ": expected true or false");
  return j[key].get<bool>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string path;
  // Model.
  std::unordered_map<std::string, int32_t> vocab;  // byte-level strings
  size_t model_vocab_len = 0;
  std::array<int32_t, 256> byte_id{};                    // id of each byte's symbol, -1 if none
  std::unordered_map<std::string, int32_t> vocab_bytes;  // raw-byte form (ignore_merges)
  MergeTable merges;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  // Added tokens (tokenizers' AddedVocabulary).
  std::unordered_map<std::string, int32_t> added_map;
  std::unordered_map<int32_t, AddedToken> added_r;
  std::unordered_set<std::string> special_set;
  int32_t added_max = -1;  // largest id in added_map
  LiteralSet raw_set, normalized_set;
  // Pipeline.
  bool nfc = false;
  struct SplitStep {
    Regex re;
    std::string literal;  // when not a regex
  };
  std::vector<SplitStep> splits;
  bool prefix_space = false;
  Regex byte_level_re;  // valid when ByteLevel use_regex
  std::vector<int32_t> template_prefix, template_suffix;
  // Decoding.
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> id_kind;  // 0: no token, 1: token, 2: special (skipped)
  int64_t vocab_size = 0;
  std::optional<int32_t> bos, eos;
  bool adds_bos = false, adds_eos = false;
  const uint64_t instance = g_next_instance.fetch_add(1);  // keys the per-thread word caches

  // ---- loading ----
  void load_model(const json& m, const std::string& file);
  void load_normalizer(const json& n, const std::string& where);
  void load_pre_tokenizer(const json& p, const std::string& where, std::vector<std::string>* steps);
  void load_post_processor(const json& p, const std::string& where);
  void add_tokens(const std::vector<AddedToken>& tokens);
  void refresh_added();
  void apply_tokenizer_config(const fs::path& config_path);
  void build_decoder();
  std::optional<int32_t> find_id(const std::string& token) const {
    auto a = added_map.find(token);
    if (a != added_map.end()) return a->second;
    auto v = vocab.find(token);
    if (v != vocab.end()) return v->second;
    return std::nullopt;
  }

  // ---- encoding ----
  void encode_text(std::string_view text, Work& w) const;
  void normalize_piece(std::string_view piece, Work& w) const;
  void pre_tokenize(std::string_view piece, size_t step, Work& w) const;
  void byte_level_piece(std::string_view piece, Work& w) const;
  void bpe(std::string_view word, Work& w) const;
  void merge_small(Work& w) const;
  void merge_heap(Work& w) const;
  template <class F>
  void split_step(const SplitStep& st, std::string_view s, F&& f) const;
  template <class F>
  void split_regex(const Regex& re, std::string_view s, F&& f) const;
};

// ---- loading --------------------------------------------------------------------------------

void HfTokenizer::Impl::load_model(const json& m, const std::string& file) {
  const std::string where = file + ": model";
  if (!m.is_object()) throw Error(where + ": missing; expected a BPE model");
  const std::string type = type_of(m);
  if (type != "BPE" && !(type.empty() && m.contains("merges"))) {
    throw Error(where + ".type: \"" + type +
                "\" is not supported; only byte-level BPE tokenizers (model.type \"BPE\") are");
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    throw Error(where + ".dropout: BPE dropout is not supported; set it to null");
  if (get_bool(m, "byte_fallback", false, where))
    throw Error(where + ".byte_fallback: true is not supported (byte-level BPE needs none)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
      throw Error(where + "." + key + ": a non-empty value is not supported");
  }
  ignore_merges = get_bool(m, "ignore_merges", false, where);
  fuse_unk = get_bool(m, "fuse_unk", false, where);
  if (!m.contains("vocab") || !m["vocab"].is_object())
    throw Error(where + ".vocab: missing; expected an object of token -> id");
  vocab.reserve(m["vocab"].size());
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || (!idj.is_number_unsigned() && idj.get<int64_t>() < 0))
      throw Error(where + ".vocab[\"" + tok + "\"]: expected a non-negative integer id");
    // The decoder keeps a table indexed by id: an absurd id would allocate gigabytes.
    if (idj.is_number_unsigned() ? idj.get<uint64_t>() >= kMaxTokenIds
                                 : idj.get<int64_t>() >= static_cast<int64_t>(kMaxTokenIds))
      throw Error(where + ".vocab[\"" + tok + "\"]: id " + idj.dump() +
                  " is out of range (titan supports ids below " + std::to_string(kMaxTokenIds) +
                  "; released vocabularies have under 300,000); the tokenizer.json is likely "
                  "corrupt");
    vocab.emplace(tok, static_cast<int32_t>(idj.get<int64_t>()));
  }
  model_vocab_len = vocab.size();
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it == vocab.end()) throw Error(where + ".unk_token: not in model.vocab");
    unk_id = it->second;
  }
  const ByteLevelAlphabet& bl = byte_level();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(&s, bl.byte_to_cp[b]);
    auto it = vocab.find(s);
    byte_id[b] = it == vocab.end() ? -1 : it->second;
  }
  if (ignore_merges) {
    std::string bytes;
    for (const auto& [tok, id] : vocab)
      if (bl.to_bytes(tok, &bytes)) vocab_bytes.emplace(bytes, id);
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    throw Error(where + ".merges: missing; expected a list of merges");
  const json& mj = m["merges"];
  merges.reserve(mj.size());
  std::string a, b;
  for (size_t r = 0; r < mj.size(); ++r) {
    const json& e = mj[r];
    const std::string at = where + ".merges[" + std::to_string(r) + "]";
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(at + ": expected \"left right\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(at + ": expected \"left right\" or [left, right]");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
      throw Error(at + ": \"" + a + "\", \"" + b + "\" or their merge is not in model.vocab");
    merges.insert(ia->second, ib->second, static_cast<int32_t>(r), iab->second);
  }
}

void HfTokenizer::Impl::load_normalizer(const json& n, const std::string& where) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (size_t i = 0; i < n["normalizers"].size(); ++i)
      load_normalizer(n["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]");
  } else {
    throw Error(where + ".type: \"" + type +
                "\" is not supported (supported normalizers: null, NFC, Sequence of NFC)");
  }
}

void HfTokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& where,
                                           std::vector<std::string>* steps) {
  const std::string type = type_of(p);
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
      load_pre_tokenizer(p["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]",
                         steps);
    return;
  }
  if (type != "Split" && type != "ByteLevel") {
    throw Error(where + ".type: " + (p.is_null() ? std::string("null") : "\"" + type + "\"") +
                " is not supported (supported: ByteLevel, or a Sequence of Split steps ending "
                "in ByteLevel)");
  }
  if (!steps->empty() && steps->back() == "ByteLevel")
    throw Error(where + ": a step after ByteLevel is not supported");
  if (type == "Split") {
    const std::string behavior = p.value("behavior", std::string());
    if (behavior != "Isolated")
      throw Error(where + ".behavior: \"" + behavior + "\" is not supported (only Isolated)");
    if (get_bool(p, "invert", false, where)) throw Error(where + ".invert: true is not supported");
    SplitStep st;
    const json& pat = member(p, "pattern");
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      st.re = Regex(onig_to_pcre2(pat["Regex"].get<std::string>(), where + ".pattern.Regex"),
                    where + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string() &&
               !pat["String"].get<std::string>().empty()) {
      st.literal = pat["String"].get<std::string>();
    } else {
      throw Error(where + ".pattern: expected {\"Regex\": ...} or a non-empty {\"String\": ...}");
    }
    splits.push_back(std::move(st));
  } else {
    prefix_space = get_bool(p, "add_prefix_space", true, where);
    if (get_bool(p, "use_regex", true, where))
      byte_level_re = Regex(onig_to_pcre2(kByteLevelPattern, where), where);
  }
  steps->push_back(type);
}

void HfTokenizer::Impl::load_post_processor(const json& p, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (size_t i = 0; i < p["processors"].size(); ++i)
      load_post_processor(p["processors"][i], where + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type != "TemplateProcessing") {
    throw Error(where + ".type: \"" + type +
                "\" is not supported (supported: null, ByteLevel, TemplateProcessing, Sequence)");
  }
  if (!p.contains("single") || !p["single"].is_array())
    throw Error(where + ".single: expected a list of template pieces");
  const json& specials = member(p, "special_tokens");
  bool seen_a = false;
  for (const json& piece : p["single"]) {
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", std::string()) != "A" || seen_a)
        throw Error(where + ".single: only one sequence $A is supported");
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].value("id", std::string());
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array())
        throw Error(where + ".special_tokens: no ids for \"" + name + "\"");
      for (const json& id : specials[name]["ids"])
        (seen_a ? template_suffix : template_prefix).push_back(id.get<int32_t>());
    } else {
      throw Error(where + ".single: unknown template piece " + piece.dump());
    }
  }
  if (!seen_a) throw Error(where + ".single: the template has no sequence $A");
}

// tokenizers' AddedVocabulary::add_tokens: an already registered token equal in every flag is
// ignored; otherwise it takes the id of the same string (added or model vocabulary) or the next
// free id, and its flags replace the old ones. Special tokens stay special.
void HfTokenizer::Impl::add_tokens(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens)
    if (t.special && !t.content.empty()) special_set.insert(t.content);
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    auto known = find_id(t.content);
    if (auto a = added_map.find(t.content); a != added_map.end() && added_r.at(a->second) == t)
      continue;
    int32_t id;
    if (known) {
      id = *known;
    } else if (added_max < 0) {
      id = static_cast<int32_t>(model_vocab_len);
    } else {
      id = (added_max >= static_cast<int32_t>(model_vocab_len) || model_vocab_len == 0)
               ? added_max + 1
               : static_cast<int32_t>(model_vocab_len);
    }
    added_map[t.content] = id;
    added_r[id] = t;
    added_max = std::max(added_max, id);
  }
}

void HfTokenizer::Impl::refresh_added() {
  std::vector<LiteralSet::Entry> raw, norm;
  for (const auto& [content, id] : added_map) {
    const AddedToken& t = added_r.at(id);
    if (t.content != content) continue;  // superseded mapping
    if (t.normalized) {
      norm.push_back({nfc ? nfc_string(content) : content, id, t});
    } else {
      raw.push_back({content, id, t});
    }
  }
  raw_set.build(std::move(raw));
  normalized_set.build(std::move(norm));
}

// torchtitan's HuggingFaceTokenizer._infer_special_tokens: the standard token keys and
// added_tokens_decoder of tokenizer_config.json are registered as special added tokens (so
// decode skips them, e.g. Qwen3's <think>); BOS and EOS are the ids of bos_token and eos_token.
void HfTokenizer::Impl::apply_tokenizer_config(const fs::path& config_path) {
  if (!fs::exists(config_path)) return;
  const std::string file = config_path.string();
  ojson c;
  try {
    c = ojson::parse(read_file(config_path));
  } catch (const ojson::exception& e) {
    throw Error(file + ": invalid JSON (" + e.what() + ")");
  }
  if (!c.is_object()) throw Error(file + ": expected a JSON object");
  auto token_of = [&](const char* key) -> std::optional<std::string> {
    if (!c.contains(key) || c[key].is_null()) return std::nullopt;
    const ojson& v = c[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    throw Error(file + ": " + key + ": expected a string, {\"content\": ...} or null");
  };
  auto flags_of = [&](const ojson& v, const std::string& content, const std::string& where) {
    AddedToken t;
    t.content = content;
    auto flag = [&](const char* k, bool def) {
      if (!v.contains(k) || v[k].is_null()) return def;
      if (!v[k].is_boolean()) throw Error(file + ": " + where + "." + k + ": expected a boolean");
      return v[k].get<bool>();
    };
    t.single_word = flag("single_word", false);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.normalized = flag("normalized", true);
    t.special = true;  // torchtitan registers them with add_special_tokens, which forces this
    return t;
  };
  std::vector<AddedToken> tokens;
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token",
                          "cls_token", "mask_token"}) {
    std::optional<std::string> s = token_of(key);
    if (!s) continue;
    if (c[key].is_object()) {
      tokens.push_back(flags_of(c[key], *s, key));
    } else {
      AddedToken t;
      t.content = *s;
      t.special = true;
      t.normalized = false;
      tokens.push_back(t);
    }
  }
  if (c.contains("added_tokens_decoder")) {
    const ojson& d = c["added_tokens_decoder"];
    if (!d.is_object()) throw Error(file + ": added_tokens_decoder: expected an object");
    for (const auto& [id, v] : d.items()) {
      if (!v.is_object() || !v.contains("content") || !v["content"].is_string()) continue;
      tokens.push_back(flags_of(v, v["content"].get<std::string>(), "added_tokens_decoder." + id));
    }
  }
  add_tokens(tokens);
  if (auto b = token_of("bos_token")) bos = find_id(*b);
  if (auto e = token_of("eos_token")) eos = find_id(*e);
}

void HfTokenizer::Impl::build_decoder() {
  int64_t mx = -1;
  for (const auto& [t, id] : vocab) mx = std::max<int64_t>(mx, id);
  for (const auto& [t, id] : added_map) mx = std::max<int64_t>(mx, id);
  vocab_size = mx + 1;
  id_bytes.assign(static_cast<size_t>(vocab_size), std::string());
  id_kind.assign(static_cast<size_t>(vocab_size), 0);
  const ByteLevelAlphabet& bl = byte_level();
  std::string bytes;
  auto set = [&](int32_t id, const std::string& tok, uint8_t kind) {
    id_bytes[static_cast<size_t>(id)] = bl.to_bytes(tok, &bytes) ? bytes : tok;
    id_kind[static_cast<size_t>(id)] = kind;
  };
  for (const auto& [t, id] : vocab) set(id, t, 1);
  for (const auto& [id, t] : added_r)
    if (added_map.count(t.content) && added_map.at(t.content) == id)
      set(id, t.content, special_set.count(t.content) ? 2 : 1);
}

// ---- encoding -------------------------------------------------------------------------------

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
  std::string_view s = nfc ? data::nfc(piece, &w.nfc_buf) : piece;
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

void HfTokenizer::Impl::bpe(std::string_view word, Work& w) const {
  const auto* p = reinterpret_cast<const unsigned char*>(word.data());
  const size_t n = word.size();
  if (n == 1) {
    const int32_t id = byte_id[p[0]];
    if (id >= 0) {
      w.out->push_back(id);
    } else if (unk_id >= 0) {
      w.out->push_back(unk_id);
    }
    return;
  }
  if (ignore_merges) {
    auto it = vocab_bytes.find(std::string(word));
    if (it != vocab_bytes.end()) {
      w.out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = n <= WordCache::kMaxBytes;
  const uint64_t h = cacheable ? hash_bytes(word) : 0;
  if (cacheable && w.cache->find(h, word, w.out)) return;
  // Initial symbols: the bytes' ids; unknown bytes become unk (fused when asked) or vanish.
  w.sym.clear();
  bool pending_unk = false;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_id[p[i]];
    if (id >= 0) {
      if (pending_unk) w.sym.push_back(unk_id);
      pending_unk = false;
      w.sym.push_back(id);
    } else if (unk_id >= 0) {
      if (pending_unk && !fuse_unk) w.sym.push_back(unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) w.sym.push_back(unk_id);
  if (w.sym.size() <= kSmallWord) {
    merge_small(w);
  } else {
    merge_heap(w);
  }
  w.out->insert(w.out->end(), w.sym.begin(), w.sym.end());
  if (cacheable && w.sym.size() <= WordCache::kMaxIds) w.cache->insert(h, word, w.sym);
}

// Repeatedly merges the lowest-ranked adjacent pair, leftmost first: the order tokenizers'
// heap-based Word::merge_all applies merges in.
void HfTokenizer::Impl::merge_small(Work& w) const {
  std::vector<int32_t>& s = w.sym;
  size_t n = s.size();
  if (n < 2) return;
  w.rank.resize(n);
  w.merged.resize(n);
  int32_t* rk = w.rank.data();
  int32_t* nid = w.merged.data();
  auto pair_at = [&](size_t i) {
    const MergeTable::Slot* m = merges.find(s[i], s[i + 1]);
    rk[i] = m ? m->rank : INT32_MAX;
    nid[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) pair_at(i);
  while (n > 1) {
    size_t best = 0;
    int32_t br = rk[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rk[i] < br) {
        br = rk[i];
        best = i;
      }
    }
    if (br == INT32_MAX) break;
    s[best] = nid[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      rk[i] = rk[i + 1];
      nid[i] = nid[i + 1];
    }
    --n;
    if (best > 0) pair_at(best - 1);
    if (best + 1 < n) pair_at(best);
  }
  s.resize(n);
}

// tokenizers' Word::merge_all for long words: a min-heap of (rank, position) candidates, stale
// entries skipped when the pair at the position no longer merges into the same token.
void HfTokenizer::Impl::merge_heap(Work& w) const {
  const size_t n = w.sym.size();
  w.nodes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    w.nodes[i] = {w.sym[i], static_cast<int32_t>(i) - 1,
                  i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  auto greater = [](const Work::HeapItem& a, const Work::HeapItem& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  w.heap.clear();
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    if (const MergeTable::Slot* m = merges.find(left, right)) {
      w.heap.push_back({m->rank, pos, m->id});
      std::push_heap(w.heap.begin(), w.heap.end(), greater);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i), w.sym[i], w.sym[i + 1]);
  while (!w.heap.empty()) {
    std::pop_heap(w.heap.begin(), w.heap.end(), greater);
    const Work::HeapItem top = w.heap.back();
    w.heap.pop_back();
    Work::Node& cur = w.nodes[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Work::Node& right = w.nodes[static_cast<size_t>(cur.next)];
    const MergeTable::Slot* m = merges.find(cur.id, right.id);
    if (!m || m->id != top.id) continue;
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (right.next >= 0) w.nodes[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, w.nodes[static_cast<size_t>(cur.prev)].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, w.nodes[static_cast<size_t>(cur.next)].id);
  }
  w.sym.clear();
  for (const Work::Node& nd : w.nodes)
    if (nd.alive) w.sym.push_back(nd.id);
}

// ---- public ---------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::load(const std::string& dir_or_file) {
  fs::path file = dir_or_file;
  std::error_code ec;
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file, ec)) {
    throw Error("tokenizer file not found: " + file.string() +
                " (pass a directory holding tokenizer.json, or the file itself)");
  }
  auto impl = std::make_unique<Impl>();
  impl->path = file.string();
  const std::string& where = impl->path;
  json j;
  try {
    j = json::parse(read_file(file));
  } catch (const json::exception& e) {
    throw Error(where + ": invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  try {
    impl->load_model(member(j, "model"), where);
    impl->load_normalizer(member(j, "normalizer"), where + ": normalizer");
    std::vector<std::string> steps;
    impl->load_pre_tokenizer(member(j, "pre_tokenizer"), where + ": pre_tokenizer", &steps);
    if (steps.empty() || steps.back() != "ByteLevel")
      throw Error(where + ": pre_tokenizer: must end with a ByteLevel step (byte-level BPE)");
    const json& dec = member(j, "decoder");
    if (type_of(dec) != "ByteLevel") {
      throw Error(where + ": decoder.type: " +
                  (dec.is_null() ? std::string("null") : "\"" + type_of(dec) + "\"") +
                  " is not supported (only ByteLevel)");
    }
    impl->load_post_processor(member(j, "post_processor"), where + ": post_processor");
    std::vector<AddedToken> added;
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      if (!j["added_tokens"].is_array()) throw Error(where + ": added_tokens: expected a list");
      for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
        const json& e = j["added_tokens"][i];
        const std::string at = where + ": added_tokens[" + std::to_string(i) + "]";
        if (!e.is_object() || !e.contains("content") || !e["content"].is_string())
          throw Error(at + ".content: expected a string");
        AddedToken t;
        t.content = e["content"].get<std::string>();
        t.single_word = get_bool(e, "single_word", false, at);
        t.lstrip = get_bool(e, "lstrip", false, at);
        t.rstrip = get_bool(e, "rstrip", false, at);
        t.normalized = get_bool(e, "normalized", true, at);
        t.special = get_bool(e, "special", false, at);
        added.push_back(std::move(t));
      }
    }
    impl->add_tokens(added);
  } catch (const json::exception& e) {
    throw Error(where + ": unexpected JSON content (" + e.what() + ")");
  }
  impl->apply_tokenizer_config(file.parent_path() / "tokenizer_config.json");
  impl->refresh_added();
  impl->build_decoder();
  auto in_template = [&](std::optional<int32_t> id) {
    if (!id) return false;
    const auto& a = impl->template_prefix;
    const auto& b = impl->template_suffix;
    return std::find(a.begin(), a.end(), *id) != a.end() ||
           std::find(b.begin(), b.end(), *id) != b.end();
  };
  impl->adds_bos = in_template(impl->bos);
  impl->adds_eos = in_template(impl->eos);
  return HfTokenizer(std::move(impl));
}

void HfTokenizer::encode_into(std::string_view text, bool add_bos, bool add_eos,
                              std::vector<int32_t>* out) const {
  const Impl& m = *impl_;
  std::string clean;
  if (!is_valid_utf8(text)) {
    clean = sanitize_utf8(text, nullptr);
    text = clean;
  }
  if (add_bos && m.bos && !m.adds_bos) out->push_back(*m.bos);
  out->insert(out->end(), m.template_prefix.begin(), m.template_prefix.end());
  Work w;
  w.out = out;
  w.cache = &thread_word_cache(m.instance);
  m.encode_text(text, w);
  out->insert(out->end(), m.template_suffix.begin(), m.template_suffix.end());
  if (add_eos && m.eos && !m.adds_eos) out->push_back(*m.eos);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_into(text, add_bos, add_eos, &ids);
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= m.vocab_size || m.id_kind[static_cast<size_t>(id)] != 1) continue;
    bytes += m.id_bytes[static_cast<size_t>(id)];
  }
  if (is_valid_utf8(bytes)) return bytes;
  return sanitize_utf8(bytes, nullptr);
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> HfTokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> HfTokenizer::token_to_id(const std::string& token) const {
  return impl_->find_id(token);
}
const std::string& HfTokenizer::path() const { return impl_->path; }

std::string HfTokenizer::sanitize_utf8(std::string_view s, int64_t* replaced) {
  std::string out;
  out.reserve(s.size());
  int64_t count = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = first_non_ascii(s, i);
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    Utf8Step st = utf8_step(p + i, s.size() - i);
    if (st.ok) {
      out.append(s.data() + i, static_cast<size_t>(st.len));
    } else {
      out += "\xEF\xBF\xBD";
      ++count;
    }
    i += static_cast<size_t>(st.len);
  }
  if (replaced) *replaced = count;
  return out;
}

}  // namespace titan::data
