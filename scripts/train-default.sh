#!/usr/bin/env bash
# README command 1: install what is missing, build Release (titan and the example plugins), train
# the default model (qwen3_debugmodel on the Debian fortunes corpus with the byte-level tokenizer).
# Extra arguments are passed to `titan train`, e.g. --training.steps 50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release -- titan titan_layout_rope titan_token_experts
exec ./build/titan train --config qwen3_debugmodel "$@"
