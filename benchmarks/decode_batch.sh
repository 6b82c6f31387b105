#!/usr/bin/env bash
# Batched decode: `titan generate` on B prompts at once (each decode step advances every prompt by
# one token), B = 1 2 4 8 16 by default, greedy, 32-token prompts and NEW new tokens, on the random
# Qwen3-0.6B-shaped model of generate_vs_torch.sh. Prints decode tokens/s (all prompts together)
# per batch size and its ratio to batch 1: memory bound while the weights' read dominates, so it
# should grow with B until the GEMMs become compute bound.
#
#   benchmarks/decode_batch.sh [BUILD_DIR=build] [DTYPE=bfloat16] ["BATCHES"] [NEW=32]
#   (needs the tools venv for the model: tools/setup_venv.sh)
set -euo pipefail
build=${1:-build}
dtype=${2:-bfloat16}
batches=${3:-1 2 4 8 16}
new=${4:-32}
root=$(cd "$(dirname "$0")/.." && pwd)
py=$root/.venv/bin/python
model=${TITAN_BENCH_MODEL:-/tmp/titan-bench-qwen3-0.6b}
[ -f "$model/model.safetensors" ] ||
  "$py" "$root/tools/make_random_hf_model.py" --preset 0.6B --dtype float32 --out "$model" >/dev/null
prompts=$(mktemp --suffix .jsonl); trap 'rm -f "$prompts"' EXIT
base=""
for b in $batches; do
  python3 -c "import json,random; random.seed(0)
for _ in range($b): print(json.dumps({'ids':[random.randrange(151936) for _ in range(32)]}))" >"$prompts"
  tps=$("$root/$build/titan" generate --config qwen3_debugmodel --model.hf_assets_path "$model" \
    --dataloader.tokenizer "$root/../shared/assets/tokenizers/qwen3" --prompts_file "$prompts" \
    --greedy --ignore_eos --max_new_tokens "$new" --training.mixed_precision_param "$dtype" \
    2>&1 | grep -o 'decode [0-9.]* tokens/s' | grep -o '[0-9.]*')
  base=${base:-$tps}
  python3 -c "print(f'$dtype batch $b: decode {$tps:.1f} tokens/s, {$tps/$base:.2f}x batch 1')"
done
