// The cost of checkpoint integrity checking: loading a native checkpoint's model.safetensors
// (about 1 GB of fp32 weights: the 0.6B flavor cut to 6 layers, 249M parameters) with and without
// first checking its checksums.json (XXH3-64 of every file, checkpoint/checksums.h), from the
// page cache (warm) and with the file dropped from the cache before each load (cold:
// posix_fadvise DONTNEED on this file only). The load converts each file in one pass, in
// parallel over 16 MiB chunks, hashing each 1 MiB block just before copying it out
// (checksums.h read_verified); BM_load_previous is the loader before checksums (one read_f32 per
// tensor). Also: hashing alone, and writing checksums.json after a save. fresh:1 loads into a
// newly allocated model each time, as a resume does (its pages first touched by the load; the
// allocation itself untimed); fresh:0 into the same model again. Fresh loads depend on what the
// process freed before (a later one reuses huge pages an earlier one released): compare them
// each alone, --benchmark_filter='verify:0/cold:0/fresh:1' and then 'verify:1/cold:0/fresh:1'.
//
//   ./build/benchmarks/titan_bench_checkpoint     (TITAN_BENCH_DIR: where the checkpoint goes;
//                                                   default: the system temp directory)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/qwen3/model.h"

namespace {
namespace fs = std::filesystem;

titan::qwen3::Qwen3Args args() {
  titan::qwen3::Qwen3Args a = titan::qwen3::flavor("0.6B");
  a.n_layers = 6;
  return a;
}

titan::qwen3::Qwen3Model& model() {
  static auto m = [] {
    auto p = std::make_unique<titan::qwen3::Qwen3Model>(args(), 1, 16);
    p->init_weights(0);
    return p;
  }();
  return *m;
}

// The checkpoint directory, written once (model.safetensors as the checkpointer writes it).
const std::string& checkpoint() {
  static const std::string dir = [] {
    const char* env = std::getenv("TITAN_BENCH_DIR");
    const fs::path d =
        fs::path(env && *env ? env : fs::temp_directory_path().string()) / "titan_bench_ckpt";
    fs::remove_all(d);
    fs::create_directories(d);
    const auto& m = model();
    std::vector<titan::ckpt::WriteTensor> ts;
    for (const auto& p : m.params())
      if (!p.alias)
        ts.push_back({p.fqn, titan::DType::F32, p.shape, m.store().param_data() + p.offset});
    auto t0 = std::chrono::steady_clock::now();
    titan::ckpt::write_file((d / "model.safetensors").string(), ts);
    auto t1 = std::chrono::steady_clock::now();
    titan::ckpt::write_checksums(d.string());
    auto t2 = std::chrono::steady_clock::now();
    std::printf(
        "checkpoint: %.3f GB; writing model.safetensors %.3f s, then checksums.json %.3f s\n",
        static_cast<double>(fs::file_size(d / "model.safetensors")) / 1e9,
        std::chrono::duration<double>(t1 - t0).count(),
        std::chrono::duration<double>(t2 - t1).count());
    return d.string();
  }();
  return dir;
}

// CPU seconds of the whole process (every thread), user + system.
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void drop_from_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// range(0): verify checksums first; range(1): cold (file dropped from the page cache);
// range(2): fresh (a newly allocated model each time).
void BM_load_checkpoint(benchmark::State& state) {
  const std::string& dir = checkpoint();
  const std::string file = dir + "/model.safetensors";
  const bool verify = state.range(0) != 0, cold = state.range(1) != 0, fresh = state.range(2) != 0;
  const double cpu0 = process_cpu_seconds();
  std::unique_ptr<titan::qwen3::Qwen3Model> m;
  for (auto _ : state) {
    if (cold || fresh) {
      state.PauseTiming();
      if (cold) drop_from_cache(file);
      if (fresh) {
        m.reset();
        m = std::make_unique<titan::qwen3::Qwen3Model>(args(), 1, 16);
      }
      state.ResumeTiming();
    }
    titan::ckpt::load_model_weights(fresh ? *m : model(), dir, false, verify);
  }
  state.counters["all_threads_cpu_ms"] =
      (process_cpu_seconds() - cpu0) * 1e3 / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(fs::file_size(file));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

// The loader before checksums (one read_f32 per tensor, in parameter order), for reference.
void BM_load_previous(benchmark::State& state) {
  const std::string& dir = checkpoint();
  const std::string file = dir + "/model.safetensors";
  const bool cold = state.range(0) != 0;
  auto& m = model();
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_from_cache(file);
      state.ResumeTiming();
    }
    titan::ckpt::SafetensorsSet set = titan::ckpt::SafetensorsSet::open(dir);
    for (const auto& p : m.params())
      if (!p.alias) set.read_f32(p.fqn, p.shape, m.store().param_data() + p.offset);
  }
  state.counters["all_threads_cpu_ms"] =
      (process_cpu_seconds() - cpu0) * 1e3 / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(fs::file_size(file));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_verify_only(benchmark::State& state) {
  const std::string& dir = checkpoint();
  for (auto _ : state) benchmark::DoNotOptimize(titan::ckpt::verify_checksums(dir));
  const double bytes = static_cast<double>(fs::file_size(dir + "/model.safetensors"));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

BENCHMARK(BM_load_checkpoint)
    ->ArgNames({"verify", "cold", "fresh"})
    ->Args({0, 0, 0})
    ->Args({1, 0, 0})
    ->Args({0, 0, 1})
    ->Args({1, 0, 1})
    ->Args({0, 1, 1})
    ->Args({1, 1, 1})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_load_previous)
    ->ArgNames({"cold"})
    ->Arg(0)
    ->Arg(1)
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_verify_only)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
