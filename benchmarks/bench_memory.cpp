// The machine's memory bandwidth, measured the way a decode step uses memory: reading 1 GiB
// (a sum over fp32 values, every OpenMP thread its part; bytes = bytes read) and copying 1 GiB
// (STREAM's copy; bytes = bytes read + written). The generation benchmark
// (benchmarks/generate_vs_torch.sh) states decode speed as a share of the read rate.
//
//   ./build/benchmarks/titan_bench_memory
#include <benchmark/benchmark.h>

#include <cstring>

#include "titan/core/buffer.h"
#include "titan/ops/simd.h"

namespace {

constexpr int64_t kFloats = int64_t{1} << 28;  // 1 GiB

// Σ p[0:n] (n a multiple of 64) in 64 independent lanes: vectorized for the CPU (function
// clones), not bound by the latency of one chain of adds.
TITAN_CLONES float sum_chunk(const float* p, int64_t n) {
  float acc[64] = {};
  for (int64_t i = 0; i < n; i += 64)
    for (int j = 0; j < 64; ++j) acc[j] += p[i + j];
  float s = 0;
  for (float x : acc) s += x;
  return s;
}

void BM_read(benchmark::State& state) {
  titan::Buffer<float> a;
  a.resize(kFloats);
  for (int64_t i = 0; i < kFloats; ++i) a.data()[i] = 1.f;
  constexpr int64_t kChunk = int64_t{1} << 16;
  for (auto _ : state) {
    float sum = 0;
    const float* p = a.data();
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t c = 0; c < kFloats; c += kChunk) sum += sum_chunk(p + c, kChunk);
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * kFloats * 4);
}

void BM_copy(benchmark::State& state) {
  titan::Buffer<float> a, b;
  a.resize(kFloats);
  b.resize(kFloats);
  for (int64_t i = 0; i < kFloats; ++i) a.data()[i] = b.data()[i] = 1.f;
  constexpr int64_t kChunk = int64_t{1} << 20;
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < kFloats; c += kChunk)
      std::memcpy(b.data() + c, a.data() + c, kChunk * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFloats * 8);
}

}  // namespace

BENCHMARK(BM_read)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_copy)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
BENCHMARK_MAIN();
