#!/usr/bin/env bash
# LoRA training speed and memory: titan vs Transformers + PEFT on the same CPU, same model, same
# precision. The model: Qwen3-0.6B's widths with 2 layers (vocabulary 151936, tied), random
# weights, one row of SEQ tokens per step; LoRA rank 16 (alpha 32) on all seven projections.
# For each precision (fp32; bf16 = torch.autocast bf16 / titan's bf16 mixed precision) it runs
#   titan LoRA, titan full fine-tune, PyTorch + PEFT LoRA (tools/bench_torch.py --lora 16)
# and prints one markdown row: median tokens/s after the first step(s), peak RSS, and the ratios
# titan/PEFT tokens/s, titan/PEFT peak memory and titan LoRA/titan full peak memory; plus the
# GEMM roofline of the precision (torch's 2048^3 matmul, from the same bench_torch.py run).
#
#   benchmarks/lora_vs_torch.sh [BUILD_DIR=build] [SEQ=2048] [STEPS=5] [PRECISIONS="float32 bfloat16"]
#
# A benchmark, not a test: run it on an otherwise idle machine; the CPU is printed.
set -euo pipefail
build="${1:-build}"
seq="${2:-2048}"
steps="${3:-5}"
precisions="${4:-float32 bfloat16}"
here="$(cd "$(dirname "$0")/.." && pwd)"
titan="$build/titan"
py="$here/.venv/bin/python"
[ -x "$titan" ] || { echo "lora_vs_torch: no $titan (build first)" >&2; exit 1; }
[ -x "$py" ] || { echo "lora_vs_torch: no $py (run tools/setup_venv.sh)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "Qwen3-0.6B widths, 2 layers, batch 1 x seq $seq, LoRA r=16 alpha=32 on wq,wk,wv,wo,w1,w2,w3;" \
     "$steps timed steps; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "$(nproc) cores, flags $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs)"
echo
echo "| precision | titan LoRA tokens/s | PEFT LoRA tokens/s | speed ratio | titan LoRA peak GiB | PEFT LoRA peak GiB | memory ratio | titan full FT peak GiB | LoRA / full | torch GEMM roofline GFLOP/s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
# median tokens/s of the logged steps after the first, and the largest peak RSS
summary() {
  python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"tps\"" in l]
tps = [r["tps"] for r in rows if r["step"] > 1]
print(round(statistics.median(tps), 2), round(max(r["memory_gib"] for r in rows), 3))' "$1"
}
for prec in $precisions; do
  run_titan() {  # $1: name, then flags
    local name=$1; shift
    "$titan" train --config qwen3_0_6b --model.n_layers 2 --training.local_batch_size 1 \
      --training.seq_len "$seq" --training.steps $((steps + 1)) --metrics.log_freq 1 \
      --training.mixed_precision_param "$prec" --lr_scheduler.warmup_steps 1 \
      --dump_folder "$out/$name" "$@" > "$out/$name.log" 2>&1 ||
      { echo "titan $name failed:" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
    summary "$out/$name/metrics.jsonl"
  }
  read -r t_lora m_lora <<< "$(run_titan lora-$prec --lora.rank 16 --lora.alpha 32)"
  read -r t_full m_full <<< "$(run_titan full-$prec)"
  "$py" "$here/tools/bench_torch.py" --preset 0.6b-2layer --batch 1 --seq "$seq" --steps "$steps" \
    --warmup 1 --dtype "$prec" --lora 16 > "$out/torch-$prec.json" 2> "$out/torch-$prec.log" ||
    { echo "bench_torch failed:" >&2; tail -5 "$out/torch-$prec.log" >&2; exit 1; }
  read -r p_tps p_mem p_gemm <<< "$(python3 -c '
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(j["tokens_per_s"], j["peak_rss_gib"], round(j["gemm_flops"] / 1e9, 1))' "$out/torch-$prec.json")"
  python3 -c '
import sys
prec, tl, pt, ml, pm, mf, g = sys.argv[1], *map(float, sys.argv[2:])
print(f"| {prec} | {tl:.1f} | {pt:.1f} | {tl / pt:.2f}x | {ml:.2f} | {pm:.2f} | {ml / pm:.2f} | {mf:.2f} | {ml / mf:.2f} | {g:.0f} |")' \
    "$prec" "$t_lora" "$p_tps" "$m_lora" "$p_mem" "$m_full" "$p_gemm"
done
