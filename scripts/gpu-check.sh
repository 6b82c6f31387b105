#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit and a C++ compiler but none
# of titan's other dependencies and no package registry (the lent H200 machine):
#  1. builds the CUDA kernels and their test against the CPU kernels with nvcc alone (no CMake,
#     oneDNN, MPI or GoogleTest needed), runs the test and cuBLASLt's GEMM probe;
#  2. with .gpu-bundle.tar.xz (titan and its libraries, made on the CI machine by
#     scripts/gpu-bundle.sh), trains on the GPU: debugmodel on the GPU against the CPU (fp32 20
#     steps, bf16 50 steps, the loss curves compared), debugmodel_moe and the reduced 30B-A3B
#     (falling loss, tokens/s, MFU), Qwen3-1.7B in bf16 at seq 4096 (MFU against the H200's peak
#     and the GEMM probe), and PyTorch + Transformers on the same model and GPU
#     (tools/bench_torch.py --device cuda, eager and torch.compile) when they are installed;
# (TITAN_GPU_CHECK_SANITIZE=1 adds compute-sanitizer memcheck and racecheck of the kernel test)
# and writes a summary. usage: scripts/gpu-check.sh [OUT_DIR] (default: $OUT, else
# ./gpu-check-out); exits non-zero when the build or a check fails. About 1 minute for part 1
# and 4-6 for part 2 on 16 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"
build=$(mktemp -d /tmp/titan-gpu-check.XXXXXX)
summary="$out/gpu-check-summary.txt"
log="$out/gpu-check.log"
: > "$log"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cxx=${CXX:-g++}
{
  echo "titan gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "nvcc: $("$nvcc" --version | tail -1)"
  echo "host compiler: $("$cxx" --version | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"
} | tee "$summary"

# The same flags as src/titan/ops/cuda/CMakeLists.txt and tests/ops/cuda/CMakeLists.txt.
gencode="--generate-code=arch=compute_90a,code=sm_90a --generate-code=arch=compute_90,code=compute_90"
t0=$(date +%s)
pids=()
for f in src/titan/ops/cuda/runtime.cu src/titan/ops/cuda/elementwise.cu src/titan/ops/cuda/gemm.cu \
         src/titan/ops/cuda/attention.cu src/titan/ops/cuda/attention_tc.cu src/titan/ops/cuda/loss.cu \
         src/titan/ops/cuda/router.cu src/titan/ops/cuda/experts.cu \
         src/titan/ops/cuda/backend.cu src/titan/optim/cuda/adamw.cu; do
  o="$build/$(basename "$f" .cu).o"
  "$nvcc" -std=c++17 -O3 $gencode --fmad=false -Werror=all-warnings \
      -Xcompiler=-Wall,-Wextra,-Werror -Isrc -c "$f" -o "$o" >>"$log" 2>&1 &
  pids+=($!)
done
"$cxx" -std=c++20 -O3 -fopenmp -Wall -Wextra -Werror -ffp-contract=off -Isrc \
    -c src/titan/ops/cpu/elementwise.cpp -o "$build/elementwise_cpu.o" >>"$log" 2>&1 &
pids+=($!)
cuda_inc=$(dirname "$(dirname "$nvcc")")/include
for f in src/titan/ops/cpu/attention.cpp src/titan/ops/cpu/router.cpp src/titan/optim/adamw.cpp tests/ops/cuda/kernels_test.cpp; do
  "$cxx" -std=c++20 -O3 -fopenmp -Wall -Wextra -Werror -Isrc -I"$cuda_inc" \
      -c "$f" -o "$build/$(basename "$f" .cpp)_host.o" >>"$log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
if [ $ok = 1 ]; then
  "$nvcc" $gencode -o "$build/titan_cuda_kernels_test" "$build"/*.o -lcublasLt -Xcompiler=-fopenmp \
      >>"$log" 2>&1 || ok=0
fi
echo "build: $([ $ok = 1 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s (log: $log)" |
  tee -a "$summary"
[ $ok = 1 ] || { tail -30 "$log"; exit 1; }

set +e
"$build/titan_cuda_kernels_test" --probe 2>&1 | tee -a "$summary"
rc=${PIPESTATUS[0]}
set -e
case $rc in
  0) echo "result: every CUDA kernel matches the CPU within its tolerance" | tee -a "$summary" ;;
  77) echo "result: no GPU visible; nothing ran" | tee -a "$summary" ;;
  *) echo "result: FAILED (exit $rc)" | tee -a "$summary" ;;
esac
# TITAN_GPU_CHECK_SANITIZE=1: the kernel test again under compute-sanitizer's memcheck and
# racecheck (out-of-bounds and shared-memory races; several minutes, so not by default).
if [ "${TITAN_GPU_CHECK_SANITIZE:-0}" = 1 ] && [ $rc != 77 ]; then
  sanitizer=$(command -v compute-sanitizer || true)
  for c in "$(dirname "$nvcc")/compute-sanitizer" "$(dirname "$(dirname "$nvcc")")/compute-sanitizer/compute-sanitizer"; do
    [ -z "$sanitizer" ] && [ -x "$c" ] && sanitizer=$c
  done
  [ -n "$sanitizer" ] || echo "compute-sanitizer: skipped (not installed with this toolkit)" | tee -a "$summary"
  for tool in ${sanitizer:+memcheck racecheck}; do
    if timeout 600 "$sanitizer" --tool $tool --error-exitcode 3 "$build/titan_cuda_kernels_test" \
         >"$out/sanitizer-$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: no errors" | tee -a "$summary"
    else
      echo "compute-sanitizer $tool: FAILED ($(grep -c '=========' "$out/sanitizer-$tool.log") report lines in sanitizer-$tool.log)" | tee -a "$summary"
      rc=1
    fi
  done
fi
# H200 dense bf16 peak (SXM): 989.4 TFLOP/s; the probe's rate as a fraction of it.
awk '/probe: cuBLASLt bf16/ {printf "bf16 GEMM probe: %.1f%% of the H200 dense bf16 peak (989.4 TFLOP/s)\n", 100*$(NF-1)/989.4}' \
  "$summary" | tee -a "$summary"
train_rc=0
if [ $rc != 77 ]; then  # a GPU is visible: train on it even if a kernel check failed (more to learn)
  bash scripts/gpu-train-check.sh "$out" "$build" || train_rc=$?
fi
rm -rf "$build"
{ [ $rc = 0 ] || [ $rc = 77 ]; } && [ $train_rc = 0 ]
