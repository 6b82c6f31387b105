#!/usr/bin/env bash
# MFU and the attention's cost as the sequence grows: trains CONFIG (by default a 2-layer model of
# Qwen3-0.6B's widths, bf16, full activation checkpointing, one sequence per step) at each
# sequence length of SEQS for STEPS steps and prints one markdown row per length: median tokens/s
# and TFLOP/s over the steps after the first, the metrics line's MFU (against the bf16 2048^3 GEMM
# roofline that titan measures at start), the MFU by torchtitan's count (the whole attention
# square), the share of the step's FLOPs that the causal attention is, and the peak memory.
#
#   benchmarks/mfu_vs_seq.sh [BUILD_DIR=build] [SEQS="512 2048 8192"] [STEPS=3] [flags...]
#   benchmarks/mfu_vs_seq.sh build "512 2048 8192 32768" 2
#
# A benchmark, not a test: run it on an otherwise idle machine; the CPU it ran on is printed.
set -euo pipefail
build="${1:-build}"
seqs="${2:-512 2048 8192}"
steps="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
titan="$build/titan"
[ -x "$titan" ] || { echo "mfu_vs_seq: no $titan (build first: scripts/build.sh $build)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "qwen3_0_6b widths, 2 layers, bf16, full AC, batch 1, $steps steps, flags: $* ;" \
     "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "flags $(grep -o -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs)"
echo
echo "| seq | tokens/s | TFLOP/s | MFU | MFU, torchtitan's count | causal attention's share of FLOPs | peak memory (GiB) |"
echo "|---|---|---|---|---|---|---|"
for seq in $seqs; do
  dir="$out/seq$seq"
  "$titan" train --config qwen3_0_6b --model.n_layers 2 --training.local_batch_size 1 \
    --training.seq_len "$seq" --training.steps "$steps" --metrics.log_freq 1 \
    --activation_checkpoint.mode full --validator.enable false --dump_folder "$dir" "$@" \
    > "$dir.log" 2>&1 || { echo "mfu_vs_seq: run failed, see below" >&2; tail -5 "$dir.log" >&2; exit 1; }
  python3 - "$dir.log" "$dir/metrics.jsonl" "$seq" <<'EOF'
import json, re, statistics, sys
log, path, seq = sys.argv[1:]
text = open(log).read()
m = re.search(r"FLOPs per token: ([0-9.e+]+) \(causal attention counted at half its square; "
              r"torchtitan's count: ([0-9.e+]+)\)", text)
ours, theirs = float(m.group(1)), float(m.group(2))
attention = theirs - ours  # half the square: what a causal kernel computes
rows = [json.loads(l) for l in open(path) if '"tps"' in l]
later = rows[1:] or rows
med = lambda k: statistics.median(r[k] for r in later)
mfu = med("mfu")
print(f"| {int(seq):,} | {med('tps'):,.0f} | {med('tflops'):.3f} | {mfu:.1f}% | "
      f"{mfu * theirs / ours:.1f}% | {100 * attention / ours:.0f}% | "
      f"{max(r['memory_gib'] for r in rows):.2f} |")
EOF
done
