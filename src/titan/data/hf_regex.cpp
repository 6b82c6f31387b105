// Oniguruma-to-PCRE2 regex translation (Unicode classes widened to Oniguruma's tables) and
// PCRE2 matching with per-thread match data and JIT stack.
#include "titan/data/hf_regex.h"

#include <new>

namespace titan::data::detail {
namespace {

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

}  // namespace

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

}  // namespace titan::data::detail
