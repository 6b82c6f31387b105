// Shared test helpers.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "titan/config/job_config.h"
#include "titan/core/error.h"

namespace titan::testing {

// Every mpirun a test process starts keeps its session files under a directory of that process's
// own (OMPI_MCA_orte_tmpdir_base, inherited): two tests starting mpirun at the same moment (ctest
// -j2) otherwise race to create the shared /tmp/ompi.HOST.UID and one launch fails. Removed at
// exit.
inline const bool kOwnMpiSessionDir = [] {
  char tmpl[] = "/tmp/titan-ompi-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return false;
  static const std::string dir = tmpl;
  ::setenv("OMPI_MCA_orte_tmpdir_base", dir.c_str(), 1);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  });
  return true;
}();

#ifdef TITAN_BINARY
// The titan binary run with `args` (a shell string), in the working directory cwd (empty: the
// test's): its exit code and stdout+stderr together.
struct CliResult {
  int code;
  std::string out;
};
inline CliResult run_titan(const std::string& args, const std::string& cwd = "") {
  std::string cmd = (cwd.empty() ? std::string() : "cd '" + cwd + "' && ") +
                    std::string(TITAN_BINARY) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
#endif

// This test binary run on np ranks under mpirun with --gtest_filter=filter (tests that check
// something across ranks: they skip themselves unless launched by mpirun). Expects a clean exit,
// no skipped test and one "PASSED 1 test" per rank; the gtest failure names the output. Skips
// the calling test where mpirun is absent (scripts/install-deps.sh installs OpenMPI).
#define TITAN_EXPECT_PASSES_ON_RANKS(np, filter)                                              \
  do {                                                                                        \
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0)                               \
      GTEST_SKIP() << "mpirun not found (scripts/install-deps.sh installs OpenMPI)";          \
    const std::string out_ = ::titan::testing::run_self_on_ranks(np, filter);                 \
    EXPECT_EQ(out_.find("SKIPPED"), std::string::npos) << out_;                               \
    int passed_ = 0;                                                                          \
    for (size_t at = out_.find("[  PASSED  ] 1 test"); at != std::string::npos;               \
         at = out_.find("[  PASSED  ] 1 test", at + 1))                                       \
      ++passed_;                                                                              \
    EXPECT_EQ(passed_, np) << out_;                                                           \
    EXPECT_TRUE(out_.size() >= 5 && out_.compare(out_.size() - 5, 5, "rc=0\n") == 0) << out_; \
  } while (0)

// Runs this binary under mpirun; stdout+stderr, then "rc=N\n" with its exit status.
inline std::string run_self_on_ranks(int np, const std::string& filter) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
  if (n <= 0) return "readlink /proc/self/exe failed\nrc=-1\n";
  self.resize(static_cast<size_t>(n));
  const std::string cmd = "timeout 300 mpirun --allow-run-as-root --oversubscribe -np " +
                          std::to_string(np) + " -x OMP_NUM_THREADS=1 " + self +
                          " --gtest_color=no --gtest_filter='" + filter + "' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "popen failed\nrc=-1\n";
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof buf, f)) out.append(buf, k);
  const int status = pclose(f);
  return out + "rc=" + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + "\n";
}

// ||got − want|| / ||want|| over n values (the gradient comparisons against PEFT and TRL).
inline double relative_l2(const float* got, const float* want, int64_t n) {
  double dd = 0, rr = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    dd += d * d;
    rr += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(dd) / std::max(std::sqrt(rr), 1e-12);
}

// A job on a tiny Qwen3 (2 layers, dim 32, 4/2 heads of 16, hidden 64, vocab 260 — room for the
// byte tokenizer) without a metrics file; tests set batch, sequence, steps and seed themselves.
inline config::JobConfig tiny_model_job() {
  config::JobConfig c;
  c.model.n_layers = 2;
  c.model.dim = 32;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.head_dim = 16;
  c.model.hidden_dim = 64;
  c.model.vocab_size = 260;
  c.metrics.enable_jsonl = false;
  return c;
}

// The shared assets ($TITAN_ASSETS, else <repo>/../shared/assets).
inline std::filesystem::path assets_dir() {
  if (const char* env = std::getenv("TITAN_ASSETS"); env && *env) return env;
  return std::filesystem::path(TITAN_SOURCE_DIR) / ".." / "shared" / "assets";
}

// Path of a required asset; throws (failing the test) with the path when it is absent.
inline std::string asset(const std::string& rel) {
  std::filesystem::path p = assets_dir() / rel;
  if (!std::filesystem::exists(p)) {
    throw std::runtime_error("missing test asset " + p.string() +
                             " (set TITAN_ASSETS to the shared assets directory)");
  }
  return p.string();
}

// How many times `what` occurs in s (overlapping occurrences counted).
inline int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A fresh temporary directory for one test (removed first if it exists).
inline std::string fresh_temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("titan_" + name + "_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// The message of the titan::Error that f throws ("" when it does not throw).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// 40 short training documents of varied length (the trainer and validator tests' corpus).
inline std::vector<std::string> fox_docs() {
  std::vector<std::string> d;
  for (int i = 0; i < 40; ++i)
    d.push_back("document " + std::to_string(i) + ": the quick brown fox " +
                std::string(static_cast<size_t>(i % 9), 'z') + " jumps over the lazy dog.");
  return d;
}

}  // namespace titan::testing
