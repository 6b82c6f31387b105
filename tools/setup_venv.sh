#!/usr/bin/env bash
# Creates (or refreshes) the Python virtual environment used only to verify
# titan.cpp against PyTorch + Hugging Face Transformers (tools/bench_torch.py).
#
#   tools/setup_venv.sh            -> venv at <repo>/.venv (git-ignored)
#   TITAN_VENV=/some/dir tools/setup_venv.sh
#   TITAN_PYTHON=/path/to/python3  (default: Debian's /usr/bin/python3)
#
# Idempotent: when the venv already holds exactly tools/requirements.txt (a
# stamp file records its sha256) and torch/transformers import, it does nothing.
# The last line printed on stdout is the venv path. Exits non-zero on failure.
#
# How torch is installed, and why
# -------------------------------
# Only PyPI is reachable here (not the PyTorch CPU wheel index), and PyPI's
# Linux x86_64 torch wheel is the CUDA build: a plain `pip install torch` pulls
# ~4 GB of nvidia-*/cuda-*/triton packages (5.6 GB venv).
# Tried first: `pip install --no-deps torch` + its small pure-python deps.
# That does NOT work: `import torch` fails with
#   ImportError: libcufile.so.0: cannot open shared object file
# because libtorch_cpu.so itself is linked (DT_NEEDED) against libcudart and
# libcupti, and libtorch_cuda.so / libtorch_python.so (loaded by torch._C on
# every import) against cublas, cublasLt, cufft, cufile, cusparse, cusparseLt,
# cudnn, nccl, nvshmem and nvrtc (cusparse in turn needs nvJitLink).
# So we install from a complete lock file with --no-deps: torch, the pure-python
# deps, exactly the nvidia-* wheels providing those linked libraries, and
# transformers' deps. Left out, because nothing on the CPU path loads them:
#   triton (~1 GB; only torch.compile's GPU backend uses it), cuda-bindings and
#   cuda-pathfinder (optional Python CUDA bindings), nvidia-cusolver (only
#   dlopen'ed lazily by libtorch_cuda_linalg.so for CUDA linear algebra),
#   nvidia-cuda-cccl (headers), nvidia-nvtx, and the cuda-toolkit meta package.
# Result: ~4.3 GB instead of ~5.6 GB, and torch + transformers train on CPU
# (checked at the end of this script). `pip check` will list the omitted
# packages as missing; that is expected.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
req="$here/requirements.txt"
venv="${TITAN_VENV:-$repo/.venv}"
log() { echo "[setup_venv] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -f "$req" ] || die "missing $req"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install $* by hand"
  log "installing Debian packages: $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >&2
}

# 1. A Python >= 3.11 that can create venvs (Debian 12 ships 3.11; venv/ensurepip
#    live in the separate python3-venv package).
if [ -n "${TITAN_PYTHON:-}" ]; then
  py="$TITAN_PYTHON"
elif [ -x /usr/bin/python3 ]; then
  py=/usr/bin/python3
elif command -v python3 >/dev/null 2>&1; then
  py="$(command -v python3)"
else
  apt_install python3 python3-venv
  py=/usr/bin/python3
fi
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || die "$py is $("$py" -V 2>&1); need Python >= 3.11 (torch 2.15 requires it)"
if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  [ "$py" = /usr/bin/python3 ] || die "$py lacks venv/ensurepip"
  apt_install python3-venv
  "$py" -c 'import venv, ensurepip' || die "python3-venv installed but venv still unusable"
fi

# 2. The venv. Recreate it if it is broken (e.g. its interpreter vanished).
vpy="$venv/bin/python"
if [ -e "$venv" ] && ! "$vpy" -c 'import sys' >/dev/null 2>&1; then
  log "existing $venv is unusable; recreating"
  rm -rf "$venv"
fi
if [ ! -e "$vpy" ]; then
  log "creating venv at $venv with $("$py" -V 2>&1)"
  "$py" -m venv "$venv"
fi

# 3. The pinned packages (skipped when the stamp matches and imports work).
stamp="$venv/.titan-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
check='import torch, transformers, safetensors, tokenizers, numpy
from transformers import Qwen3ForCausalLM'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$vpy" -c "$check" >/dev/null 2>&1; then
  log "up to date: $venv"
else
  rm -f "$stamp"
  log "installing pinned requirements (first time: ~2.7 GB download)"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$vpy" -m pip install --no-deps --only-binary=:all: -r "$req" >&2
  # Smoke test: import, then one tiny forward/backward on CPU.
  "$vpy" - >&2 <<'PY'
import torch, transformers
from transformers import Qwen3Config, Qwen3ForCausalLM
cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, use_cache=False)
cfg._attn_implementation = "sdpa"
m = Qwen3ForCausalLM(cfg)
x = torch.randint(0, 64, (1, 8))
m(input_ids=x, labels=x).loss.backward()
print(f"[setup_venv] ok: torch {torch.__version__}, transformers {transformers.__version__}")
PY
  echo "$want" > "$stamp"
fi

echo "$venv"
