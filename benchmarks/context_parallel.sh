#!/usr/bin/env bash
# Context parallelism: CP 2 (2 ranks x 1 thread, each holding half of every sequence) against one
# process x 2 threads on the same global batch, debugmodel at seq_len 4096 (one row per step),
# 8 steps each, runs alternating (this VM's speed wanders minute to minute). Prints, per
# precision and run: tokens/s (median of steps 3-8; CP's metrics line counts each rank's own
# tokens, so the two ranks' are summed), the saved activations and workspaces of the memory plan
# per rank and their ratio to one process, the peak RSS per process, and the CP report: bytes of
# keys and values sent per step against theory and the time the ranks spent in those collectives
# (waiting for each other included; nothing is overlapped with compute).
# usage: benchmarks/context_parallel.sh [BUILD_DIR] [RUNS]   (default build, 2)
set -euo pipefail
T="$(cd "${1:-build}" && pwd)/titan"
RUNS=${2:-2}
command -v mpirun > /dev/null || { echo "mpirun not found (scripts/install-deps.sh installs it)"; exit 1; }
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
root=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root || true)
clean() { sed 's/\x1b\[[0-9;]*m//g'; }
median_tps() {
  clean | grep -oE "step: +[3-8] .*tps: [0-9,]+" | grep -oE "tps: [0-9,]+" | tr -d , |
    awk '{print $2}' | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'
}
peak() { clean | grep -oE "memory: +[0-9.]+GiB" | tail -1 | awk '{print $2}'; }
plan() { clean | grep -m1 -E "  $1" | grep -oE "[0-9.]+ GiB" | awk '{print $1}'; }
for prec in bfloat16 float32; do
  for i in $(seq "$RUNS"); do
    rm -rf "$DIR"/*
    common="--config qwen3_debugmodel --model.max_seq_len 4096 --training.seq_len 4096 \
      --training.local_batch_size 1 --training.steps 8 --metrics.log_freq 1 \
      --model.attn_mask_type block_causal --training.mixed_precision_param $prec"
    one=$("$T" train $common --dump_folder "$DIR/one" 2>&1)
    cp=$(mpirun $root -np 2 -x OMP_NUM_THREADS=1 "$T" train $common \
      --parallelism.context_parallel_degree 2 --dump_folder "$DIR/cp" 2>&1)
    a=$(echo "$one" | median_tps)
    b=$(echo "$cp" | median_tps)
    sa=$(echo "$one" | plan "saved activations"); sb=$(echo "$cp" | plan "saved activations")
    wa=$(echo "$one" | plan "workspaces"); wb=$(echo "$cp" | plan "workspaces")
    printf '%s run %d: 1 process x 2 threads %s tok/s, CP 2 x 1 thread %d tok/s (ratio %s); saved activations %s -> %s GiB per rank (ratio %s), workspaces %s -> %s GiB; peak %s -> %s GiB; %s\n' \
      "$prec" "$i" "$a" $((2 * b)) "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", 2 * b / a}')" \
      "$sa" "$sb" "$(awk -v a="$sa" -v b="$sb" 'BEGIN{printf "%.3f", b / a}')" "$wa" "$wb" \
      "$(echo "$one" | peak)" "$(echo "$cp" | peak)" \
      "$(echo "$cp" | clean | grep -oE 'Context parallelism per step and rank: .*')"
  done
done
