#!/usr/bin/env bash
# README command 2: install what is missing, build, and run every test: the Release suite, the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then every libFuzzer
# target for a bounded time (TITAN_FUZZ_SECONDS each, default 30; scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
echo "== Include layering"
bash scripts/check-layering.sh
echo "== Release build and tests"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
ctest --test-dir build --output-on-failure -j "$jobs"
echo "== Two hosts (network namespaces joined by a veth pair)"
bash scripts/two-host-check.sh build
if [ -x build/tests/ops/cuda/titan_cuda_kernels_test ]; then  # built when CMake found nvcc
  echo "== CUDA kernels: compiled; their test against the CPU kernels:"
  build/tests/ops/cuda/titan_cuda_kernels_test | tail -1 || true
else
  echo "== CUDA kernels: not built (no nvcc)"
fi
echo "== ASan + UBSan build and tests"
bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTITAN_SANITIZE=ON \
  -DTITAN_BUILD_BENCHMARKS=OFF -DTITAN_CUDA=OFF
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
echo "== libFuzzer targets (${TITAN_FUZZ_SECONDS:-30} s each)"
bash scripts/fuzz.sh "${TITAN_FUZZ_SECONDS:-30}"
