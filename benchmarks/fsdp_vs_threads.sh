#!/usr/bin/env bash
# FSDP over 2 ranks x 1 thread against 1 process x 2 threads on debugmodel, the same global batch
# (4 x 256 tokens), 12 steps each, runs alternating (this VM's speed wanders minute to minute).
# Prints, per run, the median tokens/s of steps 4-12 (FSDP: summed over the ranks; the metrics
# line's tps is per rank), the peak RSS per process, the ratio, the time FSDP's collectives took
# per step and the part of it the model waited for (not hidden behind compute), and its resident
# memory at the end.
# usage: benchmarks/fsdp_vs_threads.sh [BUILD_DIR] [RUNS]   (default build, 3)
set -euo pipefail
T="$(cd "${1:-build}" && pwd)/titan"
RUNS=${2:-3}
command -v mpirun > /dev/null || { echo "mpirun not found (scripts/install-deps.sh installs it)"; exit 1; }
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
root=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root || true)
median_tps() {
  sed 's/\x1b\[[0-9;]*m//g' | grep -oE "step: +([4-9]|1[0-2]) .*tps: [0-9,]+" |
    grep -oE "tps: [0-9,]+" | tr -d , | awk '{print $2}' | sort -n |
    awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'
}
peak() { sed 's/\x1b\[[0-9;]*m//g' | grep -oE "memory: +[0-9.]+GiB" | tail -1 | awk '{print $2}'; }
for prec in bfloat16 float32; do
  for i in $(seq "$RUNS"); do
    rm -rf "$DIR"/*
    common="--config qwen3_debugmodel --training.steps 12 --metrics.log_freq 1 --training.mixed_precision_param $prec"
    one=$("$T" train $common --training.local_batch_size 4 --dump_folder "$DIR/one" 2>&1)
    fsdp=$(mpirun $root -np 2 -x OMP_NUM_THREADS=1 "$T" train $common --training.local_batch_size 2 \
      --dump_folder "$DIR/fsdp" 2>&1)
    a=$(echo "$one" | median_tps)
    b=$(echo "$fsdp" | median_tps)
    printf '%s run %d: 1 process x 2 threads %s tok/s (peak %s); FSDP 2 x 1 %d tok/s (peak %s per rank); ratio %s; %s; %s\n' \
      "$prec" "$i" "$a" "$(echo "$one" | peak)" $((2 * b)) "$(echo "$fsdp" | peak)" \
      "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", 2 * b / a}')" \
      "$(echo "$fsdp" | grep -oE "FSDP: [0-9.]+ ms per step[^;]*")" \
      "$(echo "$fsdp" | grep -oE 'resident memory now [0-9.]+ GiB')"
  done
done
