#!/usr/bin/env bash
# The README's precision × activation-checkpointing table: for each of fp32 / bf16 and AC none /
# selective (every 2nd block) / selective op / full, trains CONFIG for STEPS steps with titan and
# prints one markdown row: median tokens/s and TFLOP/s over the steps after the first, MFU against
# the GEMM roofline of the precision used (fp32 or bf16 2048^3 oneDNN GEMM, the best of 5
# measured once at the start by titan_bench, so every row is judged against the same peak), peak
# RSS (the metrics line's memory), the memory plan's total, and plan / peak.
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
bench="$build/benchmarks/titan_bench"
[ -x "$bench" ] || { echo "precision_table: no $bench (scripts/build.sh $build -- titan_bench)" >&2; exit 1; }
"$bench" --benchmark_filter='BM_gemm_(fp32|bf16)/2048' --benchmark_repetitions=5 \
  --benchmark_out="$out/gemm.json" --benchmark_out_format=json > /dev/null 2>&1
peaks=$(python3 -c '
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
best = lambda kind: max(r["TFLOP/s"] for r in runs if kind in r["name"] and r.get("run_type") == "iteration")
print(best("fp32"), best("bf16"))' "$out/gemm.json")
read -r peak_fp32 peak_bf16 <<< "$peaks"
echo "config $config, $steps steps, flags: $* ; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "flags $(grep -o -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs);" \
     "GEMM roofline fp32 $peak_fp32 TFLOP/s, bf16 $peak_bf16 TFLOP/s"
echo
echo "| precision | activation checkpointing | tokens/s | TFLOP/s | MFU | peak RSS (GiB) | plan (GiB) | plan / peak |"
echo "|---|---|---|---|---|---|---|---|"
for prec in float32 bfloat16; do
  for ac in "none 1" "selective 2" "selective op" "full 1"; do
    read -r mode opt <<< "$ac"
    dir="$out/${prec}_${mode}_${opt}"
    ac_flags=(--activation_checkpoint.mode "$mode")  # the option applies to selective mode only
    [ "$mode" = selective ] && ac_flags+=(--activation_checkpoint.selective_ac_option "$opt")
    "$titan" train --config "$config" --training.steps "$steps" --metrics.log_freq 1 \
      --training.mixed_precision_param "$prec" "${ac_flags[@]}" --dump_folder "$dir" "$@" \
      > "$dir.log" 2>&1 || { echo "precision_table: run failed, see below" >&2; tail -5 "$dir.log" >&2; exit 1; }
    plan=$(grep -E ' - +total ' "$dir.log" | awk '{for (i = 1; i <= NF; ++i) if ($i == "GiB") { print $(i-1); exit }}')
    peak=$([ "$prec" = bfloat16 ] && echo "$peak_bf16" || echo "$peak_fp32")
    python3 - "$dir/metrics.jsonl" "$prec" "$mode" "$opt" "$plan" "$peak" <<'EOF'
import json, statistics, sys
path, prec, mode, opt, plan, peak = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if '"tps"' in l]
later = rows[1:] or rows
tps = statistics.median(r["tps"] for r in later)
tflops = statistics.median(r["tflops"] for r in later)
mfu = 100 * tflops / float(peak)
rss = max(r["memory_gib"] for r in rows)
ac = mode if mode != "selective" else f"selective {opt}"
p = "bf16 mixed" if prec == "bfloat16" else "fp32"
print(f"| {p} | {ac} | {tps:,.0f} | {tflops:.3f} | {mfu:.1f}% | {rss:.3f} | {float(plan):.3f} | {float(plan) / rss:.3f} |")
EOF
  done
done
