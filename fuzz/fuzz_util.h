// Shared by the libFuzzer targets (fuzz/README in fuzz/CMakeLists.txt): every target feeds one
// parser of outside input with arbitrary bytes. The contract under test: bad input is a
// titan::Error (one line naming the file or field), never a crash, a sanitizer report, an
// uncaught exception of another type or an allocation the input alone makes huge. A target
// catches titan::Error only; anything else reaches libFuzzer as a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "titan/core/error.h"

namespace titan::fuzz {

// A file of this process holding the input (rewritten per input), in /dev/shm when it exists.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  static const std::string dir = [] {
    std::string d = (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    d += "/titan_fuzz_" + std::to_string(getpid());
    std::string cmd = "mkdir -p " + d;
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Runs fn, swallowing titan::Error (the expected answer to bad input).
template <typename Fn>
int expect_error_or_ok(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace titan::fuzz
