#!/usr/bin/env bash
# The routed experts of one MoE layer at the seed's Qwen3-30B-A3B expert shape (2,048 tokens,
# dim 2048, 64 experts, top-4, expert width 768), forward + backward in bf16, titan against
# PyTorch on the same machine in one run: titan's grouped-experts op (balanced and skewed
# routing: half the tokens to one expert) with the bf16 GEMM roofline measured in the same
# process (build/benchmarks/titan_bench), then Transformers' Qwen3MoeExperts under its
# grouped_mm (torch._grouped_mm), batched_mm and eager implementations on the same shapes and
# routing (tools/bench_torch_experts.py). Prints each time and titan's speed-up over the fastest
# PyTorch implementation that runs.
#
#   benchmarks/experts_vs_torch.sh [BUILD_DIR]      (needs the tools venv: tools/setup_venv.sh)
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
py=$root/.venv/bin/python
[ -x "$py" ] || { echo "experts_vs_torch: no tools venv (run tools/setup_venv.sh)" >&2; exit 1; }
[ -x "$root/$build/benchmarks/titan_bench" ] || { echo "experts_vs_torch: build $build first" >&2; exit 1; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
"$root/$build/benchmarks/titan_bench" --benchmark_filter='BM_experts/qwen3_30b_a3b_T2048_bf16' \
  --benchmark_out="$out" --benchmark_out_format=json 2>/dev/null | grep '^CPU:' || true
for skew in "" --skewed; do
  torch_lines=$("$py" "$root/tools/bench_torch_experts.py" $skew)
  echo "$torch_lines"
  "$py" - "$out" "${skew:+skewed}" "$torch_lines" <<'PY'
import json, re, sys
rows = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
skewed = sys.argv[2] == "skewed"
b = next(v for k, v in rows.items() if k.endswith("_skewed/iterations:3/manual_time") == skewed)
torch_ms = {m[0]: float(m[1]) for m in re.findall(r"^(\w+): ([0-9.]+) ms", sys.argv[3], re.M)}
best = min(torch_ms, key=torch_ms.get)
print(f"titan grouped_experts{' (skewed)' if skewed else ''}: {b['grouped_ms']:.1f} ms, "
      f"{100 * b['grouped_of_roofline']:.0f}% of the bf16 GEMM roofline "
      f"({b['roofline_TFLOP/s']:.3f} TFLOP/s), max/mean rows per expert "
      f"{b['max_expert_rows']:.0f}/{b['mean_expert_rows']:.0f}; "
      f"{torch_ms[best] / b['grouped_ms']:.2f}x torch {best}")
PY
done
