#!/usr/bin/env bash
# Decode speed of `titan generate` against transformers' generate on the same machine, same model
# (a random Qwen3-0.6B-shaped model: 28 layers, width 1024, vocabulary 151936, tied embeddings),
# batch 1, greedy, a 32-token prompt and 64 new tokens, fp32 and bf16; and the share of the
# machine's memory read rate (build/benchmarks/titan_bench_memory, best of 5, same run) that
# titan's decode reaches: weight bytes read per token (every parameter once: 4 bytes in fp32, 2 in
# bf16) × tokens/s ÷ read bytes/s.
#
#   benchmarks/generate_vs_torch.sh [BUILD_DIR]      (needs the tools venv: tools/setup_venv.sh)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
py=$root/.venv/bin/python
model=${TITAN_BENCH_MODEL:-/tmp/titan-bench-qwen3-0.6b}
[ -f "$model/model.safetensors" ] ||
  "$py" "$root/tools/make_random_hf_model.py" --preset 0.6B --dtype float32 --out "$model" >/dev/null
prompts=$(mktemp --suffix .jsonl)
"$py" -c "import json,random; random.seed(0); print(json.dumps({'ids':[random.randrange(151936) for _ in range(32)]}))" >"$prompts"
params=$("$py" -c "import json; c=json.load(open('$model/config.json')); D,V,L,F=c['hidden_size'],c['vocab_size'],c['num_hidden_layers'],c['intermediate_size']; hd=c['head_dim']; q=c['num_attention_heads']*hd; kv=c['num_key_value_heads']*hd; print(V*D + L*(D*(q+2*kv) + q*D + 3*D*F + 2*D + 2*hd) + D)")
read_bps() {  # the best of 5 (this VM's rate wanders)
  "$root/$build/benchmarks/titan_bench_memory" --benchmark_filter=BM_read --benchmark_repetitions=5 \
    --benchmark_format=json 2>/dev/null |
    "$py" -c "import json,sys; print(max(b['bytes_per_second'] for b in json.load(sys.stdin)['benchmarks'] if b.get('run_type') == 'iteration'))"
}
read_bps=$(read_bps)
echo "memory read rate: $("$py" -c "print(f'{$read_bps/1e9:.1f}')") GB/s; parameters $params"
for dtype in float32 bfloat16; do
  titan=$("$root/$build/titan" generate --config qwen3_debugmodel --model.hf_assets_path "$model" \
    --dataloader.tokenizer "$root/../shared/assets/tokenizers/qwen3" --prompts_file "$prompts" \
    --greedy --ignore_eos --max_new_tokens 64 --training.mixed_precision_param "$dtype" \
    2>&1 | grep -o 'decode [0-9.]* tokens/s' | grep -o '[0-9.]*')
  torch=$("$py" "$root/tools/bench_torch_generate.py" --model "$model" --dtype "$dtype" --prompt_len 32 --new 64 |
    "$py" -c "import json,sys; print(json.load(sys.stdin)['decode_tokens_per_s'])")
  bytes=$([ "$dtype" = float32 ] && echo 4 || echo 2)
  "$py" -c "t=$titan; h=$torch; share=$params*$bytes*t/$read_bps
print(f'$dtype: titan {t:.1f} tokens/s, transformers {h:.1f} tokens/s, ratio {t/h:.2f}x; titan reads {share*100:.0f}% of the memory read rate')"
done
rm -f "$prompts"
