// Errors: every user-facing failure is a titan::Error carrying one line that names the file or
// field at fault and what to do. The CLI prints it and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace titan {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws titan::Error(msg) when cond is false. For conditions a user can cause.
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace titan
