// Training-step throughput of titan's Qwen3 on this CPU, stated against the GEMM roofline of the
// precision used (fp32, or bf16 for the *_bf16 cases: bf16 mixed precision) measured in the same
// process. One iteration = forward + backward + grad norm + AdamW of one
// microbatch. Counters: tokens/s, achieved TFLOP/s (torchtitan's FLOPs formula), MFU against
// the measured GEMM peak, and roofline_ratio = achieved / GEMM peak.
//
//   ./build/benchmarks/titan_bench                      all cases
//   ./build/benchmarks/titan_bench --benchmark_filter=debugmodel
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/buffer.h"
#include "titan/core/cpu.h"
#include "titan/core/dtype.h"
#include "titan/models/qwen3/hf_config.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/gemm.h"
#include "titan/optim/adamw.h"
#include "titan/optim/state.h"
#include "titan/train/step_in_backward.h"

namespace {

double g_peak = 0, g_peak_bf16 = 0;  // fp32 and bf16 GEMM FLOP/s measured at start
using titan::DType;

// moments: the AdamW moments' dtype; in_backward: optimizer.early_step_in_backward (each unit
// updated as its gradient completes, no clipping) instead of norm, clip and step at the end;
// bf16_masters: training.dtype bfloat16 (the projections' masters are their bf16 copy; with
// in_backward).
// One untimed step first, so that every case starts with its buffers' pages in place.
void run_step_bench(benchmark::State& state, titan::qwen3::Qwen3Args args, int64_t batch,
                    int64_t seq, titan::models::AcPolicy ac = {}, DType compute = DType::F32,
                    DType moments = DType::F32, bool in_backward = false,
                    bool bf16_masters = false) {
  titan::qwen3::Qwen3Model m(args, {.max_batch = batch,
                                    .max_seq = seq,
                                    .ac = ac,
                                    .compute = compute,
                                    .bf16_masters = bf16_masters});
  const double peak = compute == DType::BF16 ? g_peak_bf16 : g_peak;
  m.init_weights(0);
  if (bf16_masters) m.store().release_masters();
  const int64_t T = batch * seq;
  std::vector<int32_t> input(T), labels(T), positions(T);
  std::mt19937 rng(0);
  for (int64_t t = 0; t < T; ++t) {
    input[t] = static_cast<int32_t>(rng() % args.vocab_size);
    labels[t] = static_cast<int32_t>(rng() % args.vocab_size);
    positions[t] = static_cast<int32_t>(t % seq);
  }
  titan::optim::AdamWState opt(moments, m.num_params(), titan::DeviceMemory{});
  titan::optim::AdamWConfig c;
  const titan::optim::Kernels& k = titan::optim::kernels("cpu");
  titan::train::StepInBackward hooks(m.store(), opt, k, c, nullptr, {});
  if (in_backward) m.store().set_hooks(&hooks);
  titan::qwen3::Batch b{batch, seq, input.data(), labels.data(), positions.data()};
  int64_t step = 0;
  double loss = 0;
  auto train_step = [&] {
    ++step;
    titan::ops::LossSum s;
    if (in_backward) {
      hooks.begin_step(8e-4f, step, static_cast<uint64_t>(step), static_cast<uint64_t>(step));
      s = m.forward_backward(b, 1.0f / static_cast<float>(T));
      m.finish_step();
    } else {
      m.zero_grad();
      s = m.forward_backward(b, 1.0f / static_cast<float>(T));
      double norm = std::sqrt(titan::optim::sum_squares(m.store().grads(), m.num_params()));
      titan::optim::clip_by_norm(m.store().grads(), m.num_params(), norm, 1.0);
      m.finish_step();  // MoE: the expert-bias update, as in training
      opt.step(k, m.store().param_data(), m.store().grads(), c, 8e-4f, step,
               static_cast<uint64_t>(step));
    }
    loss = s.sum / static_cast<double>(s.count);
  };
  train_step();
  for (auto _ : state) train_step();
  const double fpt = m.flops_per_token(seq);
  const double tokens = static_cast<double>(T) * static_cast<double>(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["TFLOP/s"] = benchmark::Counter(tokens * fpt / 1e12, benchmark::Counter::kIsRate);
  state.counters["MFU_pct"] =
      benchmark::Counter(tokens * fpt * 100.0 / peak, benchmark::Counter::kIsRate);
  state.counters["gemm_peak_TFLOP/s"] = peak / 1e12;
  state.counters["last_loss"] = loss;
  double saved = 0;  // the size table's saved activations, GiB
  for (const auto& t : m.activation_table()) saved += t.saved ? t.aligned_bytes() : 0;
  state.counters["saved_act_GiB"] = saved / (1024.0 * 1024.0 * 1024.0);
}

titan::qwen3::Qwen3Args with_layers(const char* flavor, int64_t layers) {
  titan::qwen3::Qwen3Args a = titan::qwen3::flavor(flavor);
  a.n_layers = layers;
  return a;
}

void BM_debugmodel_b4_s256(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256);
}
void BM_debugmodel_b1_s2048(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 1, 2048);
}
// Activation checkpointing on debugmodel 4x256: step time against the case above.
void BM_debugmodel_b4_s256_ac_full(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256,
                 titan::models::AcPolicy::from_config("full", "2"));
}
void BM_debugmodel_b4_s256_ac_every2(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256,
                 titan::models::AcPolicy::from_config("selective", "2"));
}
void BM_debugmodel_b4_s256_ac_op(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256,
                 titan::models::AcPolicy::from_config("selective", "op"));
}
// torchtitan's MoE debug flavor: 64 experts, top-8 (MFU on active parameters).
void BM_debugmodel_moe_b4_s256(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel_moe"), 4, 256);
}
void BM_qwen3_0_6B_2layer_s512(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 512);
}
void BM_qwen3_0_6B_2layer_s2048(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048);
}
// bf16 mixed precision (training.mixed_precision_param = bfloat16), MFU against the bf16 probe.
void BM_debugmodel_b4_s256_bf16(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256, {}, DType::BF16);
}
void BM_debugmodel_b4_s256_ac_full_bf16(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256,
                 titan::models::AcPolicy::from_config("full", "2"), DType::BF16);
}
void BM_debugmodel_b4_s256_ac_op_bf16(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel"), 4, 256,
                 titan::models::AcPolicy::from_config("selective", "op"), DType::BF16);
}
void BM_debugmodel_moe_b4_s256_bf16(benchmark::State& s) {
  run_step_bench(s, titan::qwen3::flavor("debugmodel_moe"), 4, 256, {}, DType::BF16);
}
void BM_qwen3_0_6B_2layer_s2048_bf16(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16);
}

// optimizer.state_dtype bfloat16: the same step with bf16 AdamW moments (stochastic rounding),
// next to BM_qwen3_0_6B_2layer_s2048_bf16 (fp32 moments), whose 0.6B embedding makes the
// optimizer a visible part of the step.
void BM_qwen3_0_6B_2layer_s2048_bf16_bf16state(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16, DType::BF16);
}
void BM_qwen3_0_6B_2layer_s2048_bf16_bf16state_in_backward(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16, DType::BF16, true);
}
// training.dtype bfloat16 with 8-bit moments and the step in the backward: the leanest state.
void BM_qwen3_0_6B_2layer_s2048_bf16_int8state_in_backward(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16, DType::I8, true);
}
void BM_qwen3_0_6B_2layer_s2048_bf16masters_int8state_in_backward(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16, DType::I8, true, true);
}
// optimizer.state_dtype int8: 8-bit block-wise moments (bitsandbytes' AdamW8bit).
void BM_qwen3_0_6B_2layer_s2048_bf16_int8state(benchmark::State& s) {
  run_step_bench(s, with_layers("0.6B", 2), 1, 2048, {}, DType::BF16, DType::I8);
}

// The AdamW update alone over n parameters, fp32, bf16 or 8-bit moments (arg 1: 0 fp32, 1 bf16,
// 2 int8). GB/s counts the bytes moved: p and m, v read and written, g read (not the 8-bit
// state's scales, 1/64 of its bytes).
void BM_adamw(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DType dt = state.range(1) == 2 ? DType::I8 : state.range(1) ? DType::BF16 : DType::F32;
  titan::Buffer<float> p(n), g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = 1e-3f * static_cast<float>(i % 101);
  titan::optim::AdamWState opt(dt, n, titan::DeviceMemory{});
  int64_t step = 0;
  for (auto _ : state) {
    ++step;
    opt.step(titan::optim::kernels("cpu"), p.data(), g.data(), titan::optim::AdamWConfig{}, 1e-3f,
             step, static_cast<uint64_t>(step));
  }
  const double bytes = static_cast<double>(n) * (12.0 + 4.0 * static_cast<double>(dtype_size(dt)));
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["ns/param"] =
      benchmark::Counter(static_cast<double>(n) * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(dt == DType::BF16 ? "bf16 moments"
                 : dt == DType::I8 ? "int8 moments"
                                   : "fp32 moments");
}

// The GEMM roofline itself, as a benchmark row: fp32 n×n×n oneDNN matmul.
void BM_gemm_fp32(benchmark::State& state) {
  const int64_t n = state.range(0);
  titan::Buffer<float> a(n * n), b(n * n), c(n * n);
  for (auto _ : state)
    titan::ops::gemm(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * static_cast<double>(state.iterations()) / 1e12,
                         benchmark::Counter::kIsRate);
}

// bf16 inputs, fp32 output and accumulation (gemm_bf16: oneDNN's bf16 matmul, or the converting
// fallback on CPUs without native bf16); the label names the implementation oneDNN picked.
void BM_gemm_bf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  titan::Buffer<float> f(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) f[i] = static_cast<float>(i % 7) * 0.1f;
  titan::Buffer<uint16_t> a(n * n), b(n * n);
  titan::f32_to(titan::DType::BF16, f.data(), n * n, a.data());
  titan::f32_to(titan::DType::BF16, f.data(), n * n, b.data());
  for (auto _ : state)
    titan::ops::gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n, false);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * static_cast<double>(state.iterations()) / 1e12,
                         benchmark::Counter::kIsRate);
  state.SetLabel(titan::ops::gemm_isa(true));
}

// Rates are per wall-clock second (UseRealTime): the work runs on every OpenMP thread.
BENCHMARK(BM_gemm_fp32)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gemm_bf16)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256)->Unit(benchmark::kMillisecond)->MinTime(5.0)->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_ac_full)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_ac_every2)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_ac_op)->Unit(benchmark::kMillisecond)->MinTime(5.0)->UseRealTime();
BENCHMARK(BM_debugmodel_moe_b4_s256)->Unit(benchmark::kMillisecond)->MinTime(5.0)->UseRealTime();
BENCHMARK(BM_debugmodel_b1_s2048)->Unit(benchmark::kMillisecond)->MinTime(5.0)->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s512)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_bf16)->Unit(benchmark::kMillisecond)->MinTime(5.0)->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_ac_full_bf16)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();
BENCHMARK(BM_debugmodel_b4_s256_ac_op_bf16)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();
BENCHMARK(BM_debugmodel_moe_b4_s256_bf16)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16_bf16state)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16_bf16state_in_backward)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16_int8state)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16_int8state_in_backward)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_qwen3_0_6B_2layer_s2048_bf16masters_int8state_in_backward)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_adamw)
    ->Args({1 << 26, 0})
    ->Args({1 << 26, 1})
    ->Args({1 << 26, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Loading a Hugging Face checkpoint (TITAN_BENCH_HF_DIR, e.g. a random 0.6B bf16 model from
// tools/make_random_hf_model.py): mmap, validate, convert to fp32 into the model's buffer.
// GB/s counts the bytes on disk; files are in the page cache after the first iteration.
void BM_load_hf(benchmark::State& state, std::string dir) {
  titan::qwen3::Qwen3Args a = titan::qwen3::args_from_hf_config(dir);
  titan::qwen3::Qwen3Model m(a, 1, 16);
  const double bytes = static_cast<double>(titan::ckpt::SafetensorsSet::open(dir).total_bytes());
  for (auto _ : state) titan::ckpt::load_model_weights(m, dir, true);
  state.counters["GB/s"] = benchmark::Counter(bytes * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["GB"] = bytes / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* dir = std::getenv("TITAN_BENCH_HF_DIR"))
    benchmark::RegisterBenchmark("BM_load_hf", BM_load_hf, std::string(dir))
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3)
        ->UseRealTime();
  g_peak = titan::ops::gemm_probe_flops();
  g_peak_bf16 = titan::ops::gemm_probe_flops_bf16();
  std::printf(
      "CPU: %s, %d threads; GEMM roofline (2048^3 oneDNN): fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s "
      "(%s)\n",
      titan::cpu::describe().c_str(), titan::cpu::num_threads(), g_peak / 1e9, g_peak_bf16 / 1e9,
      titan::ops::bf16_gemm_native() ? "native bf16" : "converting path");
  std::printf("oneDNN GEMM implementations (2048^3): fp32 %s, bf16 %s\n",
              titan::ops::gemm_isa(false).c_str(), titan::ops::gemm_isa(true).c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
