// Encode throughput of titan's native Hugging Face tokenizer (HfTokenizer) with the real Qwen3
// tokenizer.json, on tinyshakespeare (documents split at blank lines) + WikiText-2 valid and
// test (one document per article): MB/s of UTF-8 input, single-threaded and with OpenMP over
// documents. tools/bench_tokenizers.py measures the Python `tokenizers` library the same way.
//
//   ./build/benchmarks/titan_bench_tokenizer
//   TITAN_ASSETS=/path/to/assets ./build/benchmarks/titan_bench_tokenizer --benchmark_format=json
//
// "Warm" cases encode the corpus once before timing (the BPE word cache is filled, as is the
// library's after its first pass); "Cold" loads a fresh tokenizer before every timed pass.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "titan/data/hf_tokenizer.h"

namespace {
namespace fs = std::filesystem;

fs::path assets_dir() {
  if (const char* env = std::getenv("TITAN_ASSETS"); env && *env) return env;
  return fs::path(TITAN_SOURCE_DIR) / ".." / "shared" / "assets";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "missing benchmark asset %s (set TITAN_ASSETS)\n", p.string().c_str());
    std::exit(1);
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Corpus {
  std::vector<std::string> docs;
  int64_t bytes = 0;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    const std::string shakespeare = slurp(assets_dir() / "datasets/tinyshakespeare.txt");
    size_t pos = 0;
    while (pos <= shakespeare.size()) {
      size_t next = shakespeare.find("\n\n", pos);
      if (next == std::string::npos) next = shakespeare.size();
      if (next > pos) c.docs.push_back(shakespeare.substr(pos, next - pos));
      pos = next + 2;
    }
    for (const char* split : {"valid", "test"}) {
      std::istringstream lines(
          slurp(assets_dir() / "datasets/wikitext-2" / (std::string(split) + ".jsonl")));
      std::string line;
      while (std::getline(lines, line))
        if (!line.empty()) c.docs.push_back(nlohmann::json::parse(line)["text"]);
    }
    for (const std::string& d : c.docs) c.bytes += static_cast<int64_t>(d.size());
    return c;
  }();
  return c;
}

std::string qwen3_dir() { return (assets_dir() / "tokenizers/qwen3").string(); }

const titan::data::HfTokenizer& qwen3() {
  static const titan::data::HfTokenizer tok = titan::data::HfTokenizer::load(qwen3_dir());
  return tok;
}

int64_t encode_all(const titan::data::HfTokenizer& tok, bool parallel) {
  const Corpus& c = corpus();
  const int64_t n = static_cast<int64_t>(c.docs.size());
  int64_t ids = 0;
  if (parallel) {
#pragma omp parallel for schedule(dynamic, 8) reduction(+ : ids)
    for (int64_t i = 0; i < n; ++i)
      ids += static_cast<int64_t>(tok.encode(c.docs[static_cast<size_t>(i)], false, false).size());
  } else {
    for (int64_t i = 0; i < n; ++i)
      ids += static_cast<int64_t>(tok.encode(c.docs[static_cast<size_t>(i)], false, false).size());
  }
  return ids;
}

void report(benchmark::State& state, int64_t ids) {
  const Corpus& c = corpus();
  state.SetBytesProcessed(state.iterations() * c.bytes);
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(c.bytes) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["docs"] = static_cast<double>(c.docs.size());
  state.counters["ids"] = static_cast<double>(ids);
  state.counters["omp_threads"] = static_cast<double>(state.range(0));
}

void BM_Qwen3EncodeWarm(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  omp_set_num_threads(threads);
  const auto& tok = qwen3();
  int64_t ids = encode_all(tok, threads > 1);  // warm the BPE cache
  for (auto _ : state) {
    ids = encode_all(tok, threads > 1);
    benchmark::DoNotOptimize(ids);
  }
  report(state, ids);
}

void BM_Qwen3EncodeCold(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  omp_set_num_threads(threads);
  int64_t ids = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tok =
        std::make_unique<titan::data::HfTokenizer>(titan::data::HfTokenizer::load(qwen3_dir()));
    state.ResumeTiming();
    ids = encode_all(*tok, threads > 1);
    benchmark::DoNotOptimize(ids);
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  report(state, ids);
}

void thread_args(benchmark::internal::Benchmark* b) {
  b->Arg(1);
  const int max = omp_get_max_threads();
  if (max > 1) b->Arg(max);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Qwen3EncodeWarm)->Apply(thread_args);
BENCHMARK(BM_Qwen3EncodeCold)->Apply(thread_args)->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
