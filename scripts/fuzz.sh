#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) and runs each for SECONDS
# (default 30; CI's bound) from fuzz/seeds/<target> plus the test fixtures, one after the other.
# A finding (crash, sanitizer report, uncaught non-titan exception, leak-free OOM past 2 GiB)
# fails the script and leaves the input in build-fuzz/findings/<target>/. Prints executions per
# target. Longer runs: scripts/fuzz.sh 3600 (the corpora grow in build-fuzz/corpus/).
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors hf_config tokenizer_json job_toml flags jsonl chat token_shard train_state
  plugin_file generation_config adapter_config gzip preference)
bash scripts/build.sh build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DTITAN_FUZZ=ON -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_BENCHMARKS=OFF -DTITAN_CUDA=OFF \
  -- $(printf 'fuzz_%s ' "${targets[@]}")
out=build-fuzz
status=0
for t in "${targets[@]}"; do
  corpus=$out/corpus/$t
  mkdir -p "$corpus" "$out/findings/$t"
  cp -n fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true
  case $t in  # the fixtures as extra seeds
    safetensors) cp -n tests/fixtures/hf/tied_gqa2/model.safetensors "$corpus"/fixture.safetensors ;;
    hf_config) for d in tests/fixtures/hf/*/; do cp -n "$d/config.json" "$corpus/$(basename "$d").json"; done ;;
    generation_config) for d in tests/fixtures/hf/*/; do cp -n "$d/generation_config.json" "$corpus/$(basename "$d").json" 2>/dev/null || true; done ;;
    adapter_config) for d in tests/fixtures/lora/*/; do cp -n "$d/adapter_config.json" "$corpus/$(basename "$d").json"; done ;;
    plugin_file) for so in /lib/x86_64-linux-gnu/libm.so.6 /lib/x86_64-linux-gnu/libdl.so.2; do
                   [ -f "$so" ] && cp -n "$so" "$corpus/$(basename "$so")"; done ;;
    train_state) TITAN_FUZZ_WRITE_SEED="$corpus/position.json" "$out/fuzz/fuzz_$t" \
                   fuzz/seeds/train_state/empty.json > /dev/null 2>&1 || true ;;
  esac
  log=$out/findings/$t/log.txt
  if ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 \
       "$out/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
       -timeout=10 -print_final_stats=1 -artifact_prefix="$out/findings/$t/" "$corpus" \
       > "$log" 2>&1; then
    execs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
    echo "fuzz_$t: ${secs}s, $execs executions, no findings"
  else
    echo "fuzz_$t: FINDING (see $log and the input in $out/findings/$t/):"
    grep -E "ERROR|SUMMARY|runtime error|uncaught|terminate" "$log" | head -5
    status=1
  fi
done
exit $status
