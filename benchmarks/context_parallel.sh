#!/usr/bin/env bash
# Context parallelism: CP 2 (2 ranks x 1 thread, each holding half of every sequence) against one
# process x 2 threads on the same global batch, debugmodel with one row per step: seq_len 4096
# with block-causal documents (fp32 and bf16), and seq_len 2048 plain causal (fp32; the causal
# square split evenly by the head-tail chunks); 6 steps each, runs alternating (this VM's speed
# wanders minute to minute). Prints, per case and run: tokens/s (median of steps 3-6; CP's metrics line counts each rank's own
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
  clean | grep -oE "step: +[3-6] .*tps: [0-9,]+" | grep -oE "tps: [0-9,]+" | tr -d , |
    awk '{print $2}' | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'
}
peak() { clean | grep -oE "memory: +[0-9.]+GiB" | awk '{v = $2} END {print v}'; }
# (awk reads to the end: a reader that stops early fails the pipeline under pipefail)
plan() { clean | awk -v k="  $1" 'index($0, k) && !n++ {print $(NF - 1)}'; }
for case in "bfloat16 4096 block_causal" "float32 4096 block_causal" "float32 2048 causal"; do
  read -r prec seq mask <<< "$case"
  for i in $(seq "$RUNS"); do
    rm -rf "$DIR"/*
    common="--config qwen3_debugmodel --training.seq_len $seq \
      --training.local_batch_size 1 --training.steps 6 --metrics.log_freq 1 \
      --model.attn_mask_type $mask --training.mixed_precision_param $prec"
    one=$("$T" train $common --dump_folder "$DIR/one" 2>&1) || { echo "$one"; exit 1; }
    cp=$(mpirun $root -np 2 -x OMP_NUM_THREADS=1 "$T" train $common \
      --parallelism.context_parallel_degree 2 --dump_folder "$DIR/cp" 2>&1) || { echo "$cp"; exit 1; }
    a=$(echo "$one" | median_tps)
    b=$(echo "$cp" | median_tps)
    sa=$(echo "$one" | plan "saved activations"); sb=$(echo "$cp" | plan "saved activations")
    wa=$(echo "$one" | plan "workspaces"); wb=$(echo "$cp" | plan "workspaces")
    printf '%s seq %s %s run %d: 1 process x 2 threads %s tok/s, CP 2 x 1 thread %d tok/s (ratio %s); saved activations %s -> %s GiB per rank (ratio %s), workspaces %s -> %s GiB; peak %s -> %s; %s\n' \
      "$prec" "$seq" "$mask" "$i" "$a" $((2 * b)) "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", 2 * b / a}')" \
      "$sa" "$sb" "$(awk -v a="$sa" -v b="$sb" 'BEGIN{printf "%.3f", b / a}')" "$wa" "$wb" \
      "$(echo "$one" | peak)" "$(echo "$cp" | peak)" \
      "$(echo "$cp" | clean | grep -oE 'Context parallelism per step and rank: .*')"
  done
done
