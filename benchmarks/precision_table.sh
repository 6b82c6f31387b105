#!/usr/bin/env bash
# The README's precision × activation-checkpointing table: for each of fp32 / bf16 and AC none /
# selective (every 2nd block) / selective op / full, trains CONFIG for STEPS steps with titan and
# prints one markdown row: median tokens/s and MFU over the steps after the first (MFU against the
# GEMM probe of the precision used, measured at start), peak RSS (the metrics line's memory), the
# memory plan's total, and plan / peak.
#
#   benchmarks/precision_table.sh [BUILD_DIR=build] [CONFIG=qwen3_debugmodel] [STEPS=6] [flags...]
#   benchmarks/precision_table.sh build qwen3_debugmodel_moe 4 --training.seq_len 256
#
# A benchmark, not a test: run it on an otherwise idle machine; the CPU it ran on is printed.
set -euo pipefail
build="${1:-build}"
config="${2:-qwen3_debugmodel}"
steps="${3:-6}"
shift $(( $# < 3 ? $# : 3 ))
titan="$build/titan"
[ -x "$titan" ] || { echo "precision_table: no $titan (build first: scripts/build.sh $build)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "config $config, $steps steps, flags: $* ; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
echo "| precision | activation checkpointing | tokens/s | MFU | peak RSS (GiB) | plan (GiB) | plan / peak |"
echo "|---|---|---|---|---|---|---|"
for prec in float32 bfloat16; do
  for ac in "none 1" "selective 2" "selective op" "full 1"; do
    read -r mode opt <<< "$ac"
    dir="$out/${prec}_${mode}_${opt}"
    "$titan" train --config "$config" --training.steps "$steps" --metrics.log_freq 1 \
      --training.mixed_precision_param "$prec" --activation_checkpoint.mode "$mode" \
      --activation_checkpoint.selective_ac_option "$opt" --dump_folder "$dir" "$@" \
      > "$dir.log" 2>&1 || { echo "precision_table: run failed, see below" >&2; tail -5 "$dir.log" >&2; exit 1; }
    plan=$(grep -E ' - +total ' "$dir.log" | awk '{for (i = 1; i <= NF; ++i) if ($i == "GiB") { print $(i-1); exit }}')
    python3 - "$dir/metrics.jsonl" "$prec" "$mode" "$opt" "$plan" <<'EOF'
import json, statistics, sys
path, prec, mode, opt, plan = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if '"tps"' in l]
later = rows[1:] or rows
tps = statistics.median(r["tps"] for r in later)
mfu = statistics.median(r["mfu"] for r in later)
peak = max(r["memory_gib"] for r in rows)
ac = mode if mode != "selective" else f"selective {opt}"
p = "bf16 mixed" if prec == "bfloat16" else "fp32"
print(f"| {p} | {ac} | {tps:,.0f} | {mfu:.1f}% | {peak:.3f} | {float(plan):.3f} | {float(plan) / peak:.3f} |")
EOF
  done
done
