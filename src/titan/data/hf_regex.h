// tokenizer.json regexes (Oniguruma syntax) translated to PCRE2 patterns, and a compiled PCRE2
// pattern (UTF + UCP, JIT when available) for the Hugging Face tokenizer's pre-tokenizers.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "titan/core/error.h"

namespace titan::data::detail {

// The tokenizer.json (Oniguruma) pattern p as a PCRE2 pattern, \p{L}, \p{N}, \s and \S rewritten
// to match as Oniguruma's Unicode tables do. Throws titan::Error, prefixed by where, for what it
// cannot translate (nested character classes, an unterminated [:).
std::string onig_to_pcre2(std::string_view p, const std::string& where);

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

}  // namespace titan::data::detail
