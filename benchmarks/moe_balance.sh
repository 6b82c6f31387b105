#!/usr/bin/env bash
# Does training restore the experts' balance? qwen3_debugmodel_moe (8 layers, 64 experts, top-8,
# 4×256 tokens a step: 128 routed rows per expert on average) from random init for STEPS steps,
# four ways: no balancing (load_balance_coeff 0), torchtitan's aux-loss-free bias update (the
# flavor's load_balance_coeff 1e-3) and Transformers' auxiliary loss (router_aux_loss) at its
# default coefficient 1e-3 and at 1e-2.
# Prints, per run, each layer's largest expert load over the mean (max/mean: 1 is perfect balance,
# 8 means one expert takes every token's slot) at a few steps, and the final loss.
#
#   benchmarks/moe_balance.sh [BUILD_DIR=build] [STEPS=200] [DIR=/tmp/titan-moe-balance]
#
# A benchmark, not a test: about 6 minutes a run on 2 cores; runs already finished in DIR are kept.
set -euo pipefail
build="${1:-build}"
steps="${2:-200}"
dir="${3:-/tmp/titan-moe-balance}"
titan="$build/titan"
[ -x "$titan" ] || { echo "moe_balance: no $titan (build first: scripts/build.sh $build)" >&2; exit 1; }
mkdir -p "$dir"
common=(--config qwen3_debugmodel_moe --training.steps "$steps" --metrics.log_freq 1)
run() {  # name flags...: trains into $dir/name unless it finished there already
  local name=$1; shift
  [ -f "$dir/$name/metrics.jsonl" ] && grep -q "\"step\":$steps," "$dir/$name/metrics.jsonl" && return
  rm -rf "${dir:?}/$name"
  "$titan" train "${common[@]}" --dump_folder "$dir/$name" "$@" >"$dir/$name.log" 2>&1
}
run none --model.load_balance_coeff 0
run bias
run aux --model.load_balance_coeff 0 --model.router_aux_loss true
run aux_1e-2 --model.load_balance_coeff 0 --model.router_aux_loss true --model.router_aux_loss_coef 0.01
python3 - "$dir" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
mean = 4 * 256 * 8 / 64
marks = sorted({1, 5, 10, 25, 50, 100, steps} & set(range(1, steps + 1)))
for name, what in [("none", "no balancing"), ("bias", "bias update, load_balance_coeff 1e-3"),
                   ("aux", "aux loss, router_aux_loss_coef 1e-3"),
                   ("aux_1e-2", "aux loss, router_aux_loss_coef 1e-2")]:
    rows = {}
    for line in open(f"{d}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if "expert_load" in r:
            rows[r["step"]] = r
    print(f"\n{name} ({what}): final loss {rows[steps]['loss']:.4f}; max/mean expert load per layer")
    layers = [e["layer"] for e in rows[steps]["expert_load"]]
    print("| step | " + " | ".join(f"layer {l}" for l in layers) + " |")
    print("|---" * (len(layers) + 1) + "|")
    for s in marks:
        loads = {e["layer"]: e["max"] / mean for e in rows[s]["expert_load"]}
        print(f"| {s} | " + " | ".join(f"{loads[l]:.2f}" for l in layers) + " |")
PY
