#!/usr/bin/env bash
# Part 2 of scripts/gpu-check.sh: titan's training step on the GPU, from .gpu-bundle.tar.xz
# (scripts/gpu-bundle.sh), run through the bundled loader so that none of titan's dependencies
# need installing. Appends to OUT_DIR/gpu-check-summary.txt; each run's log and metrics.jsonl go
# to WORK_DIR/logs/train-NAME.log and train-NAME.jsonl. The runs go in order of what they tell
# (GPU against CPU first, the speed targets next), each only if it can end before
# TITAN_GPU_CHECK_DEADLINE (epoch seconds, set by gpu-check.sh; default: 450 s from now); the
# ones that cannot are listed as skipped.
#
# Checks (exit 1 when one fails; tolerances stated, and why):
#   fp32   debugmodel, 20 steps, GPU against CPU (the CPU's curves made with the bundle, on the
#          CI machine; run here when the bundle has none for these arguments): every step's loss
#          within 1e-4 relative. Both are fp32 throughout; they differ only in the order of GEMM
#          and attention sums (~1e-6 relative per op), which 20 small AdamW steps do not amplify
#          past 1e-4.
#   bf16   the same in bf16 mixed precision, 50 steps: within 2e-2 relative. bf16 rounds every
#          GEMM input to 8 bits of mantissa, so one fp32 ulp of difference before a rounding
#          becomes 2^-8 after it; the curves must agree to the noise of bf16 training.
#   moe, a3b   falling loss (the mean of the last 3 logged losses below the first's).
#   check-kernel --training.device cuda on debugmodel_moe: its tolerances (check_kernel.h).
# Reported: tokens/s, MFU, memory; Qwen3-1.7B bf16 seq 4096 MFU against 989.4 TFLOP/s and the
# GEMM probe; PyTorch's tokens/s on the same model (skipped when torch or transformers is
# missing; TITAN_TORCH_PYTHON names another interpreter).
# TITAN_GPU_CHECK_DRY=1 runs every GPU run on the CPU, shrunk (2 layers, dim 256, 4 steps,
# seq 128; PyTorch on debugmodel), to check this script's mechanics on a machine without a GPU.
# usage: scripts/gpu-train-check.sh OUT_DIR WORK_DIR
#        scripts/gpu-train-check.sh --refs STAGE_DIR   (gpu-bundle.sh: the CPU's loss curves of
#        the GPU-against-CPU runs, made with the staged titan into STAGE_DIR/ref)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --refs ]; then
  unset TITAN_GPU_CHECK_DRY  # the references are the full runs
  b=$2
  work=$(mktemp -d /tmp/titan-gpu-refs.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  out=$work
  deadline=$(( $(date +%s) + 3600 ))
else
  out=$1
  work=$2
  b="$work/bundle"
  deadline=${TITAN_GPU_CHECK_DEADLINE:-$(( $(date +%s) + 450 ))}
fi
logs="$work/logs"
mkdir -p "$out" "$logs"
summary="$out/gpu-check-summary.txt"
say() { echo "$*" | tee -a "$summary"; }
if [ "${1:-}" != --refs ]; then
  if [ ! -f .gpu-bundle.tar.xz ]; then
    say "training: FAILED: no .gpu-bundle.tar.xz (make it with scripts/gpu-bundle.sh on the CI machine; the device tool's carry takes it along)"
    exit 1
  fi
  mkdir -p "$b"
  # Python's tarfile where tar cannot call xz.
  tar -C "$b" -xJf .gpu-bundle.tar.xz 2>/dev/null ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .gpu-bundle.tar.xz "$b" ||
    { say "training: FAILED to unpack .gpu-bundle.tar.xz"; exit 1; }
fi
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_root=$(dirname "$(dirname "$nvcc")")
libpath="$b/lib"
for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib" \
         /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
  [ -d "$d" ] && libpath="$libpath:$d"
done
# NVIDIA's Python wheels (nvidia/*/lib: NCCL, which the CUDA toolkit does not hold, cuBLASLt,
# the runtime) and torch/lib, wherever that Python installed them.
py_libs=$("${TITAN_TORCH_PYTHON:-python3}" - 2>/dev/null <<'PY' || true
import glob, importlib.util, os
dirs = []
for name in ("nvidia", "torch"):
    spec = importlib.util.find_spec(name)
    for root in (spec.submodule_search_locations or []) if spec else []:
        dirs += sorted(glob.glob(os.path.join(root, "*", "lib"))) if name == "nvidia" else [os.path.join(root, "lib")]
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
[ -n "$py_libs" ] && libpath="$libpath:$py_libs"
if ! "$b/lib/ld.so" --library-path "$libpath" --list "$b/titan" >"$logs/ldd.txt" 2>&1 ||
   grep -q "not found" "$logs/ldd.txt"; then
  say "training: FAILED: titan's libraries are not all here ($(grep 'not found' "$logs/ldd.txt" | tr -s ' \t' ' ' | tr '\n' ';'); last line of ldd.txt: $(tail -1 "$logs/ldd.txt"))"
  exit 1
fi

byte="--dataloader.dataset_path $b/data/wikitext-test-byte.bin"
qwen="--dataloader.dataset_path $b/data/wikitext-test-qwen3.bin"
failed=0
skipped=()
cut=0
gpu=cuda
dry=()
dry_moe=""
if [ "${TITAN_GPU_CHECK_DRY:-0}" = 1 ]; then
  gpu=cpu
  dry=(--model.n_layers 2 --model.dim 256 --model.hidden_dim 512 --training.steps 4
       --training.seq_len 128 --metrics.log_freq 1)
  dry_moe="--model.moe_hidden_dim 128"
  say "  (dry run: every GPU run on the CPU, shrunk: ${dry[*]} $dry_moe)"
fi
# limited NAME SECONDS LEAST CMD...: CMD stopped after SECONDS, or at the deadline if that comes
# first; not started (1 returned) when less than LEAST seconds are left, or cut short by the
# deadline: then listed as skipped and `cut` set to 1. Returns CMD's exit status otherwise.
limited() {
  local name=$1 secs=$2 least=$3
  shift 3
  cut=0
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt "$least" ]; then
    skipped+=("$name")
    cut=1
    return 1
  fi
  local capped=0
  [ "$left" -lt "$secs" ] && { secs=$left; capped=1; }
  timeout -k 10 "$secs" "$@"
  local rc=$?
  if [ $rc = 124 ] && [ $capped = 1 ]; then
    skipped+=("$name (cut short)")
    cut=1
  fi
  return $rc
}
# run NAME SECONDS LEAST ARGS...: one `titan train` (limited as above), its log and metrics kept;
# 0 when it finished; a failure (not a skip for time) is reported and counted.
run() {
  local name=$1 secs=$2 least=$3
  shift 3
  local dir="$work/runs/$name"
  rm -rf "$dir"
  limited "$name" "$secs" "$least" "$b/lib/ld.so" --library-path "$libpath" "$b/titan" train \
    --dump_folder "$dir" --metrics.enable_jsonl true --checkpoint.enable false "$@" "${dry[@]}" \
    >"$logs/train-$name.log" 2>&1
  local rc=$?
  [ -f "$dir/metrics.jsonl" ] && cp "$dir/metrics.jsonl" "$logs/train-$name.jsonl"
  if [ $rc != 0 ] && [ $cut = 0 ]; then
    say "  $name: FAILED (exit $rc; last lines of train-$name.log:)"
    tail -3 "$logs/train-$name.log" | sed 's/^/    /' | tee -a "$summary"
    failed=1
  fi
  return $rc
}
# stats NAME: the last logged step's loss, tokens/s, MFU and memory.
stats() {
  python3 - "$logs/train-$1.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tps"' in l]
if not rows:
    sys.exit(print("no logged step in " + sys.argv[1]))
r = rows[-1]
print(f"step {r['step']}: loss {r['loss']:.4f}, {r['tps']:,.0f} tokens/s, "
      f"{r['tflops']:.1f} TFLOP/s, MFU {r['mfu']:.2f}%, memory {r['memory_gib']:.2f} GiB")
EOF
}
# compare NAME BOUND: GPU run NAME-cuda against NAME-cpu, step by step.
compare() {
  python3 - "$logs/train-$1-cuda.jsonl" "$logs/train-$1-cpu.jsonl" "$2" <<'EOF'
import json, sys
def curve(f):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f)) if "tps" in r}
g, c, bound = curve(sys.argv[1]), curve(sys.argv[2]), float(sys.argv[3])
missing = sorted(set(c) - set(g))
if not c or missing:
    print(f"FAILED: the CPU curve has {len(c)} steps, the GPU's lacks {len(missing)} of them")
    sys.exit(1)
steps = sorted(c)
worst = max(steps, key=lambda s: abs(g[s] - c[s]) / abs(c[s]))
rel = abs(g[worst] - c[worst]) / abs(c[worst])
print(f"{len(steps)} steps, max |loss_gpu - loss_cpu| / loss_cpu = {rel:.2e} at step {worst} "
      f"(bound {bound:g}); first {c[steps[0]]:.4f} -> last {c[steps[-1]]:.4f} (cpu), "
      f"{g[steps[-1]]:.4f} (gpu): {'ok' if rel <= bound else 'FAILED'}")
sys.exit(0 if rel <= bound else 1)
EOF
}
falling() {
  python3 - "$logs/train-$1.jsonl" <<'EOF'
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"tps"' in x]
if not l:
    sys.exit(print("no logged step: NOT falling") or 1)
ok = len(l) >= 4 and sum(l[-3:]) / 3 < l[0]
print(f"loss {l[0]:.4f} -> {l[-1]:.4f} over {len(l)} logged steps: {'falling' if ok else 'NOT falling'}")
sys.exit(0 if ok else 1)
EOF
}

# cmp_args PREC: the arguments (p) and bound of the debugmodel run compared GPU against CPU.
# The CPU's curve in the bundle is used only if it was made with the same arguments (core: all
# but the data's path, which differs between here and where the bundle was made).
cmp_args() {
  core="--config qwen3_debugmodel --training.seq_len 256 --training.local_batch_size 8 --debug.seed 1 --metrics.log_freq 1 --metrics.peak_flops 1e15"
  if [ "$1" = fp32 ]; then core="$core --training.mixed_precision_param float32 --training.steps 20"; bound=1e-4
  else core="$core --training.mixed_precision_param bfloat16 --training.steps 50"; bound=2e-2; fi
  p="$byte $core"
}
if [ "${1:-}" = --refs ]; then
  mkdir -p "$b/ref"
  for prec in fp32 bf16; do
    cmp_args $prec
    run "$prec-cpu" 3600 0 $p --training.device cpu || exit 1
    cp "$logs/train-$prec-cpu.jsonl" "$b/ref/$prec-cpu.jsonl" || exit 1
    echo "$core" >"$b/ref/$prec-args.txt"
  done
  exit 0
fi
say "training: titan $(cat "$b/commit") from the bundle"
# GPU against CPU on debugmodel: the CPU's curves come with the bundle (made where it was made);
# an older bundle without them, or a dry run, makes them here.
for prec in fp32 bf16; do
  cmp_args $prec
  run "$prec-cuda" 120 30 $p --training.device $gpu || continue
  if [ -f "$b/ref/$prec-cpu.jsonl" ] && [ "$gpu" = cuda ] &&
     [ "$(cat "$b/ref/$prec-args.txt" 2>/dev/null)" = "$core" ]; then
    cp "$b/ref/$prec-cpu.jsonl" "$logs/train-$prec-cpu.jsonl"
  else
    run "$prec-cpu" 240 60 $p --training.device cpu || continue
  fi
  line=$(compare "$prec" "$bound") || failed=1
  say "  debugmodel $prec, GPU vs CPU: $line"
done
# Qwen3-1.7B bf16 at seq 4096: MFU against the H200's dense bf16 peak and the GEMM probe.
if run 1.7b 240 60 --config qwen3_1_7b $qwen --training.seq_len 4096 --training.local_batch_size 1 --training.steps 6 --metrics.log_freq 1 --training.device $gpu; then
  say "  Qwen3-1.7B bf16 seq 4096 ($gpu): $(stats 1.7b) (MFU against the GEMM probe's rate)"
  python3 - "$logs/train-1.7b.jsonl" <<'PY' | tee -a "$summary"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"tps"' in l][-1]
print(f"    against the H200's 989.4 TFLOP/s dense bf16 peak: MFU {100 * r['tflops'] / 989.4:.2f}% (target 50%)")
PY
fi
# PyTorch + Transformers on the same model and GPU (bf16 autocast, SDPA); titan's tokens/s on
# Qwen3-1.7B (above) as a ratio of theirs. Eager now, torch.compile last (it compiles for
# minutes).
torch_py=${TITAN_TORCH_PYTHON:-python3}
torch_args=(--device cuda --preset 1.7B --seq 4096 --batch 1 --dtype bfloat16 --steps 4 --warmup 2)
[ "$gpu" = cpu ] && torch_args=(--device cpu --preset debugmodel --seq 128 --batch 2 --dtype bfloat16 --steps 2 --warmup 1)
have_torch=0
"$torch_py" -c "import torch, transformers; assert torch.cuda.is_available() or '$gpu' == 'cpu'" 2>/dev/null &&
  have_torch=1
[ $have_torch = 1 ] || say "  PyTorch: skipped ($torch_py has no torch with CUDA, or no transformers)"
torch_run() {
  local mode=$1 extra=()
  [ $mode = compile ] && extra=(--compile)
  limited "torch-$mode" 300 90 "$torch_py" tools/bench_torch.py "${torch_args[@]}" "${extra[@]}" \
    >"$logs/torch-$mode.json" 2>"$logs/torch-$mode.log"
  local rc=$?
  [ $rc = 2 ] && return
  if [ $rc != 0 ]; then
    say "  PyTorch $mode: FAILED (torch-$mode.log: $(tail -1 "$logs/torch-$mode.log"))"
    return
  fi
  local line
  line=$(python3 - "$logs/torch-$mode.json" "$logs/train-1.7b.jsonl" <<'PY'
import json, sys
t = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
msg = (f"{t['tokens_per_s']:,.0f} tokens/s, {t['tflops']:.1f} TFLOP/s, GEMM roofline "
       f"{t['gemm_flops'] / 1e12:.1f} TFLOP/s (torch {t['torch_version']})")
try:
    titan = [json.loads(l) for l in open(sys.argv[2]) if '"tps"' in l][-1]["tps"]
    msg += f"; titan / torch = {titan / t['tokens_per_s']:.2f}x (target: 1.3x over eager)"
except (OSError, IndexError):
    pass
print(msg)
PY
)
  say "  PyTorch $mode (${torch_args[*]}): $line"
}
[ $have_torch = 1 ] && torch_run eager
# MoE: debugmodel_moe, and the seed's reduced 30B-A3B (4 layers, 64 experts, top-4, Qwen3's
# vocabulary) in bf16.
if run moe 120 40 --config qwen3_debugmodel_moe $byte --training.seq_len 1024 --training.local_batch_size 8 --training.steps 30 --metrics.log_freq 5 --training.device $gpu $dry_moe; then
  f=$(falling moe) || failed=1
  say "  debugmodel_moe bf16 ($gpu): $f; $(stats moe)"
fi
if run a3b 240 60 --config nki_qwen3_30b_a3b $qwen --training.seq_len 2048 --training.local_batch_size 2 --training.steps 12 --metrics.log_freq 2 --training.device $gpu $dry_moe; then
  f=$(falling a3b) || failed=1
  say "  30B-A3B reduced (4 layers, 64 experts, top-4) bf16 ($gpu): $f; $(stats a3b) (MFU of the active parameters)"
fi
# check-kernel on the device: the CUDA RoPE and grouped-experts ops against the CPU's.
limited check-kernel 180 30 "$b/lib/ld.so" --library-path "$libpath" "$b/titan" check-kernel \
  --config qwen3_debugmodel_moe --training.device $gpu --training.seq_len 256 \
  --training.local_batch_size 2 ${dry_moe} >"$logs/check-kernel.log" 2>&1
rc=$?
[ $cut = 1 ] && rc=skipped
case $rc in
  0) say "  check-kernel --training.device $gpu (debugmodel_moe: RoPE, grouped experts fp32/bf16 vs the CPU): all within tolerance" ;;
  skipped) ;;
  *) say "  check-kernel --training.device $gpu: FAILED (last line of check-kernel.log: $(tail -1 "$logs/check-kernel.log"))"
     failed=1 ;;
esac
[ $have_torch = 1 ] && torch_run compile
[ ${#skipped[@]} = 0 ] || say "  skipped for the time budget: ${skipped[*]}"
[ $failed = 0 ] && say "training: every check that ran passed" || say "training: FAILED (see above)"
exit $failed
