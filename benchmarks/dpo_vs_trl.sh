#!/usr/bin/env bash
# DPO training speed and memory: titan (dpo.enable) vs TRL's DPOTrainer (tools/bench_trl_dpo.py)
# on the same CPU, model, data and precision. The model: Qwen3-0.6B's widths with 2 layers
# (vocabulary 151936, tied), random weights; PAIRS preference pairs per step (plain text, the
# Qwen3 tokenizer), each prompt about PROMPT tokens and each completion about COMPLETION; loss
# sigmoid, beta 0.1; the reference log-probabilities computed once before training by both (TRL's
# precompute_ref_log_probs). For each precision (fp32; bf16 = TRL's bf16 autocast / titan's bf16
# mixed precision) one markdown row: median tokens/s after the first step (every token of both
# rows of a pair through the model), peak RSS, the ratios, and titan's MFU against the GEMM peak
# it measured in the same run (the MFU counts 6·N per token; DPO's extra forward for the policy's
# log-probabilities is 2·N more, so the work done is a third above what the MFU counts).
#
#   benchmarks/dpo_vs_trl.sh [BUILD_DIR=build] [PAIRS=4] [PROMPT=192] [COMPLETION=128] [STEPS=4] [PRECISIONS="float32 bfloat16"]
#
# A benchmark, not a test: run it on an otherwise idle machine; the CPU is printed.
set -euo pipefail
build="${1:-build}"
pairs="${2:-4}"
prompt="${3:-192}"
completion="${4:-128}"
steps="${5:-4}"
precisions="${6:-float32 bfloat16}"
here="$(cd "$(dirname "$0")/.." && pwd)"
titan="$build/titan"
py="$here/.venv/bin/python"
assets="${TITAN_ASSETS:-$here/../shared/assets}"
tok="$assets/tokenizers/qwen3"
[ -x "$titan" ] || { echo "dpo_vs_trl: no $titan (build first)" >&2; exit 1; }
[ -x "$py" ] || { echo "dpo_vs_trl: no $py (run tools/setup_venv.sh)" >&2; exit 1; }
[ -f "$tok/tokenizer.json" ] || { echo "dpo_vs_trl: no $tok/tokenizer.json (set TITAN_ASSETS)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
python3 - "$out/pairs.jsonl" "$prompt" "$completion" $((pairs * (steps + 1))) <<'PY'
import json, random, sys
random.seed(0)
words = "the of and to in is was for on as with by he at from his an were are which this".split()
def text(n):  # about n tokens: common words, one token each with their leading space
    return "".join(" " + random.choice(words) for _ in range(n))
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[4])):  # the pairs the run trains on: TRL precomputes every one
        f.write(json.dumps({"prompt": "Question" + text(int(sys.argv[2])) + "?",
                            "chosen": text(int(sys.argv[3])), "rejected": text(int(sys.argv[3]))}) + "\n")
PY
echo "Qwen3-0.6B widths, 2 layers, DPO sigmoid, $pairs pairs per step, prompt ~$prompt and completions ~$completion tokens;" \
     "$steps timed steps; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "$(nproc) cores, flags $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | xargs)"
echo
echo "| precision | titan tokens/s | TRL tokens/s | speed ratio | titan peak GiB | TRL peak GiB | memory ratio | titan MFU (6N) |"
echo "|---|---|---|---|---|---|---|---|"
for prec in $precisions; do
  "$titan" train --config qwen3_0_6b --model.n_layers 2 --dpo.enable --dataloader.dataset jsonl \
    --dataloader.dataset_path "$out/pairs.jsonl" --dataloader.tokenizer "$tok" \
    --training.local_batch_size "$pairs" --training.seq_len 1024 --training.steps $((steps + 1)) \
    --metrics.log_freq 1 --training.mixed_precision_param "$prec" --lr_scheduler.warmup_steps 1 \
    --dump_folder "$out/titan-$prec" > "$out/titan-$prec.log" 2>&1 ||
    { echo "titan failed:" >&2; tail -5 "$out/titan-$prec.log" >&2; exit 1; }
  "$py" "$here/tools/bench_trl_dpo.py" --data "$out/pairs.jsonl" --tokenizer "$tok" \
    --batch "$pairs" --steps "$steps" --warmup 1 --dtype "$prec" > "$out/trl-$prec.json" \
    2> "$out/trl-$prec.log" || { echo "bench_trl_dpo failed:" >&2; tail -5 "$out/trl-$prec.log" >&2; exit 1; }
  python3 - "$prec" "$out/titan-$prec/metrics.jsonl" "$out/trl-$prec.json" <<'PY'
import json, statistics, sys
prec, metrics, trl = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics) if '"tps"' in l]
tps = statistics.median(r["tps"] for r in rows if r["step"] > 1)
mfu = statistics.median(r["mfu"] for r in rows if r["step"] > 1)
mem = max(r["memory_gib"] for r in rows)
t = json.loads(open(trl).read().strip().splitlines()[-1])
print(f"| {prec} | {tps:.0f} | {t['tokens_per_s']:.0f} | {tps / t['tokens_per_s']:.2f}x | {mem:.2f} | "
      f"{t['peak_rss_gib']:.2f} | {mem / t['peak_rss_gib']:.2f} | {mfu:.1f}% |")
PY
done
