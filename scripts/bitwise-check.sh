#!/usr/bin/env bash
# Records what a refactoring must leave bitwise unchanged: the loss and grad norm of every step of
# a set of short runs (one process fp32 and bf16, FSDP 2, TP 2, FSDP 2 x EP 2, LoRA) and the
# SHA-256 of every file their Hugging Face exports wrote; also the byte counts of their end-of-run
# communication reports and the memory plans of the same layouts. Run it with the binary before and after
# a change and diff the two digests:
#   scripts/bitwise-check.sh OLD/titan /tmp/before.txt
#   scripts/bitwise-check.sh build/titan /tmp/after.txt
#   diff /tmp/before.txt /tmp/after.txt && echo bitwise-identical
# usage: scripts/bitwise-check.sh TITAN DIGEST [STEPS]   (STEPS default 30; about 3 minutes on 2 cores)
set -euo pipefail
titan=$(realpath "$1"); digest=$2; steps=${3:-30}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
mpi=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
common=(--training.steps "$steps" --metrics.log_freq 1 --debug.seed 7 --checkpoint.enable
        --checkpoint.interval 1000000 --checkpoint.last_save_in_hf)
: >"$digest"
record() {  # name: appends the run's step, loss, grad_norm and its exports' hashes to the digest
  local name=$1 dir=$work/$1
  python3 - "$dir/metrics.jsonl" "$name" >>"$digest" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "grad_norm" in r:
        print(sys.argv[2], r["step"], repr(r["loss"]), repr(r["grad_norm"]))
EOF
  (cd "$dir" && find checkpoint -type f | sort | xargs -r sha256sum | sed "s|^|$name |") >>"$digest"
  # the reports' byte counts (their times vary from run to run)
  grep -o 'INFO - [A-Za-z ]*per step and rank[^,]*, [0-9.]* MiB in theory[^(]*' "$work/$name.log" |
    sed "s|^INFO - |$name |" >>"$digest" || true
}
plan() {  # name titan args...: the memory plan, without the lines measured from the process
  local name=$1; shift
  "$titan" plan "$@" 2>/dev/null | grep -v 'process at start\|total\|GEMM probe' |
    sed "s|^|plan $name |" >>"$digest" || true
}
run() {  # name launcher... -- titan args...
  local name=$1; shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done; shift
  "${launch[@]}" "$titan" train --dump_folder "$work/$name" "${common[@]}" "$@" \
    >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; echo "bitwise-check: $name failed"; exit 1; }
  record "$name"
}
run fp32 env -- --config qwen3_debugmodel --training.mixed_precision_param float32
run bf16 env -- --config qwen3_debugmodel --checkpoint.export_dtype bfloat16
run fsdp2 "${mpi[@]}" -np 2 -- --config qwen3_debugmodel
run tp2 "${mpi[@]}" -np 2 -- --config qwen3_debugmodel --parallelism.tensor_parallel_degree 2
run fsdp2_ep2 "${mpi[@]}" -np 4 -- --config qwen3_debugmodel_moe \
  --parallelism.expert_parallel_degree 2 --training.local_batch_size 2
run lora env -- --config qwen3_debugmodel --lora.rank 8 --lora.alpha 16
plan fp32 --config qwen3_debugmodel --training.mixed_precision_param float32
plan bf16 --config qwen3_debugmodel
plan fsdp2 --config qwen3_debugmodel --parallelism.data_parallel_shard_degree 2
plan tp2 --config qwen3_debugmodel --parallelism.tensor_parallel_degree 2
plan fsdp2_ep2 --config qwen3_debugmodel_moe --parallelism.data_parallel_shard_degree 2 \
  --parallelism.expert_parallel_degree 2 --training.local_batch_size 2
plan lora --config qwen3_debugmodel --lora.rank 8 --lora.alpha 16
echo "bitwise-check: $(wc -l <"$digest") lines in $digest"
