#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit and a C++ compiler but none
# of titan's other dependencies and no package registry (the lent H200 machine):
#  1. builds the CUDA kernels and their test against the CPU kernels with nvcc alone (no CMake,
#     oneDNN, MPI or GoogleTest needed), runs the test and cuBLASLt's GEMM probe;
#  2. with .gpu-bundle.tar.xz (titan and its libraries, made on the CI machine by
#     scripts/gpu-bundle.sh), trains on the GPU (scripts/gpu-train-check.sh): debugmodel on the
#     GPU against the CPU's loss curves (fp32 20 steps, bf16 50), Qwen3-1.7B in bf16 at seq 4096
#     (MFU against the H200's peak and the GEMM probe), PyTorch + Transformers on the same model
#     and GPU, debugmodel_moe and the reduced 30B-A3B (falling loss, tokens/s, MFU), check-kernel
#     on cuda, torch.compile; each only while the time budget lasts.
# (TITAN_GPU_CHECK_SANITIZE=1 adds compute-sanitizer memcheck and racecheck of the kernel test)
# Writes two files to OUT_DIR (the device tool brings back at most 8): gpu-check-summary.txt
# (also printed) and gpu-check-logs.tar.gz (the build log, every run's log and metrics).
# usage: scripts/gpu-check.sh [OUT_DIR] (default: $OUT, else ./gpu-check-out)
# TITAN_GPU_CHECK_BUDGET: seconds for the whole check (default 450; a run that would not finish
# inside it is skipped and listed). Exits non-zero when a check fails, when nvidia-smi lists a GPU
# the CUDA runtime cannot use, or when the bundle is missing.
set -euo pipefail
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # before the cd below: a relative OUT_DIR is the caller's
cd "$(dirname "$0")/.."
export TITAN_GPU_CHECK_DEADLINE=$(( $(date +%s) + ${TITAN_GPU_CHECK_BUDGET:-450} ))
work=$(mktemp -d /tmp/titan-gpu-check.XXXXXX)
logs="$work/logs"
mkdir -p "$logs"
summary="$out/gpu-check-summary.txt"
log="$logs/build.log"
# Whatever happens, the logs come back as one file and the work folder goes (the script's exit
# status kept: set -e must not end the trap at a failing tar).
trap 'status=$?; set +e; tar -C "$logs" -czf "$out/gpu-check-logs.tar.gz" . 2>/dev/null; rm -rf "$work"; exit $status' EXIT
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_root=$(dirname "$(dirname "$nvcc")")
cxx=${CXX:-g++}
gpu_listed=0
[[ $(nvidia-smi -L 2>/dev/null || true) == *GPU* ]] && gpu_listed=1
{
  echo "titan gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "nvcc: $("$nvcc" --version | tail -1)"
  echo "host compiler: $("$cxx" --version | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /' || echo "gpu: nvidia-smi not available"
} | tee "$summary"

# The flags of src/titan/ops/cuda/CMakeLists.txt and tests/ops/cuda/CMakeLists.txt, less -Werror:
# another host compiler may warn where CI's does not, and that must not cost the run (the
# warnings are counted below and kept in build.log).
gencode="--generate-code=arch=compute_90a,code=sm_90a --generate-code=arch=compute_90,code=compute_90"
t0=$(date +%s)
pids=()
for f in src/titan/ops/cuda/runtime.cu src/titan/ops/cuda/elementwise.cu src/titan/ops/cuda/gemm.cu \
         src/titan/ops/cuda/attention.cu src/titan/ops/cuda/attention_tc.cu src/titan/ops/cuda/loss.cu \
         src/titan/ops/cuda/router.cu src/titan/ops/cuda/experts.cu \
         src/titan/ops/cuda/backend.cu src/titan/optim/cuda/adamw.cu; do
  timeout -k 10 300 "$nvcc" -std=c++17 -O3 $gencode --fmad=false -Xcompiler=-Wall,-Wextra -Isrc -c "$f" \
      -o "$work/$(basename "$f" .cu).o" >>"$log" 2>&1 &
  pids+=($!)
done
timeout -k 10 300 "$cxx" -std=c++20 -O3 -fopenmp -Wall -Wextra -ffp-contract=off -Isrc \
    -c src/titan/ops/cpu/elementwise.cpp -o "$work/elementwise_cpu.o" >>"$log" 2>&1 &
pids+=($!)
for f in src/titan/ops/cpu/attention.cpp src/titan/ops/cpu/attention_cached.cpp \
         src/titan/ops/cpu/router.cpp src/titan/optim/adamw.cpp tests/ops/cuda/kernels_test.cpp; do
  timeout -k 10 300 "$cxx" -std=c++20 -O3 -fopenmp -Wall -Wextra -Isrc -I"$cuda_root/include" \
      -c "$f" -o "$work/$(basename "$f" .cpp)_host.o" >>"$log" 2>&1 &
  pids+=($!)
done
ok=1
for p in "${pids[@]}"; do wait "$p" || ok=0; done
if [ $ok = 1 ]; then
  "$nvcc" $gencode -o "$work/titan_cuda_kernels_test" "$work"/*.o -lcublasLt -Xcompiler=-fopenmp \
      >>"$log" 2>&1 || ok=0
fi
echo "build: $([ $ok = 1 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s, $(grep -c 'warning' "$log" || true) warning lines (build.log)" |
  tee -a "$summary"

# cuBLASLt and the runtime from the toolkit, wherever its lib folder is.
for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
rc=1
if [ $ok = 1 ]; then
  set +e
  # Line-buffered, so that a crash or the timeout keeps what it printed.
  timeout -k 10 180 stdbuf -oL "$work/titan_cuda_kernels_test" --probe 2>&1 |
    tee "$logs/kernels.log" | tee -a "$summary"
  rc=${PIPESTATUS[0]}
  set -e
else
  tail -30 "$log"
fi
case $rc in
  0) echo "result: every CUDA kernel matches the CPU within its tolerance" | tee -a "$summary" ;;
  77) if [ $gpu_listed = 1 ]; then
        echo "result: FAILED: nvidia-smi lists a GPU but the CUDA runtime sees none (a driver older than CUDA $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')?)" | tee -a "$summary"
      else
        echo "result: no GPU visible; nothing ran" | tee -a "$summary"
      fi ;;
  124) echo "result: FAILED: the kernel test did not finish in 180 s" | tee -a "$summary" ;;
  *) echo "result: FAILED (exit $rc)" | tee -a "$summary" ;;
esac
# TITAN_GPU_CHECK_SANITIZE=1: the kernel test again under compute-sanitizer's memcheck and
# racecheck (out-of-bounds and shared-memory races; several minutes, so not by default).
if [ "${TITAN_GPU_CHECK_SANITIZE:-0}" = 1 ] && [ $ok = 1 ] && [ $rc != 77 ]; then
  sanitizer=$(command -v compute-sanitizer || true)
  for c in "$(dirname "$nvcc")/compute-sanitizer" "$cuda_root/compute-sanitizer/compute-sanitizer"; do
    [ -z "$sanitizer" ] && [ -x "$c" ] && sanitizer=$c
  done
  [ -n "$sanitizer" ] || echo "compute-sanitizer: skipped (not installed with this toolkit)" | tee -a "$summary"
  for tool in ${sanitizer:+memcheck racecheck}; do
    if timeout -k 10 600 "$sanitizer" --tool $tool --error-exitcode 3 "$work/titan_cuda_kernels_test" \
         >"$logs/sanitizer-$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: no errors" | tee -a "$summary"
    else
      echo "compute-sanitizer $tool: FAILED ($(grep -c '=========' "$logs/sanitizer-$tool.log") report lines in sanitizer-$tool.log)" | tee -a "$summary"
      rc=1
    fi
  done
fi
# H200 dense bf16 peak (SXM): 989.4 TFLOP/s; the probe's rate as a fraction of it.
awk '/probe: cuBLASLt bf16/ {printf "bf16 GEMM probe: %.1f%% of the H200 dense bf16 peak (989.4 TFLOP/s)\n", 100*$(NF-1)/989.4}' \
  "$summary" | tee -a "$summary"
train_rc=0
# Training when a GPU is there, even if the kernel build or a kernel check failed (it needs only
# the bundle, and there is more to learn).
if [ $gpu_listed = 1 ] || { [ $ok = 1 ] && [ $rc != 77 ]; }; then
  bash scripts/gpu-train-check.sh "$out" "$work" || train_rc=$?
fi
{ [ $rc = 0 ] || { [ $rc = 77 ] && [ $gpu_listed = 0 ]; }; } && [ $train_rc = 0 ]
