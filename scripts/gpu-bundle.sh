#!/usr/bin/env bash
# Stages, on the CI machine, what scripts/gpu-check.sh needs to *train* on a GPU machine that has
# the CUDA toolkit but none of titan's other dependencies and no package registry (the lent
# H200): titan built here with CUDA (Release), the shared libraries it links that are not the
# CUDA toolkit's or the driver's (oneDNN, OpenMPI, PCRE2, utf8proc, toml++, OpenMP, and this
# machine's C and C++ runtime with its loader, so that the binary runs whatever glibc the GPU
# machine has: gpu-check starts it through the bundled loader), two token shards to train on
# (wikitext-2's test split with the byte-level tokenizer and with Qwen3's, from the shared assets)
# and the CPU's loss curves of the runs gpu-check compares with the GPU's.
# Writes .gpu-bundle.tar.xz (ignored by git; the device tool's `carry` takes it along, under its
# 64 MiB limit).
# usage: scripts/gpu-bundle.sh [BUILD_DIR]   (default: build; configured and built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
assets=${TITAN_ASSETS:-../shared/assets}
bash scripts/build.sh "$build" -DCMAKE_BUILD_TYPE=Release -- titan  # up to date with the tree
ldd "$build/titan" | grep -q libcudart || {
  echo "gpu-bundle: $build/titan was built without CUDA (no nvcc?); nothing to bundle" >&2
  exit 1
}
for f in "$assets/datasets/wikitext-2/test.jsonl" "$assets/tokenizers/qwen3/tokenizer.json"; do
  [ -f "$f" ] || { echo "gpu-bundle: $f is missing (set TITAN_ASSETS to the shared assets)" >&2; exit 1; }
done
stage=$(mktemp -d /tmp/titan-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/data"
cp "$build/titan" "$stage/titan"
# Every library the binary loads but CUDA's and the driver's (which the GPU machine has).
ldd "$build/titan" | awk '/=>/ && $3 ~ /^\// {print $3}' |
  grep -v -E '/libcuda\.|/libcudart\.|/libcublas|/libcublasLt\.|/libnccl\.|/libcudnn' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -L "$(ldd "$build/titan" | awk '/ld-linux/ {print ($3 ~ /^\// ? $3 : $1)}')" "$stage/lib/ld.so"
strip --strip-unneeded "$stage/titan" "$stage"/lib/*.so* 2>/dev/null || true
"$build/titan" tokenize --tokenizer byte --input "$assets/datasets/wikitext-2/test.jsonl" \
  --output "$stage/data/wikitext-test-byte.bin" >/dev/null
"$build/titan" tokenize --tokenizer "$assets/tokenizers/qwen3" \
  --input "$assets/datasets/wikitext-2/test.jsonl" --output "$stage/data/wikitext-test-qwen3.bin" >/dev/null
# The CPU's loss curves that the GPU runs are compared with, made here (minutes on 2 cores) so
# that the GPU machine's time goes to the GPU.
bash scripts/gpu-train-check.sh --refs "$stage" >/dev/null
git describe --always --dirty > "$stage/commit" 2>/dev/null || echo unknown > "$stage/commit"
tar -C "$stage" -cJf .gpu-bundle.tar.xz .
echo "gpu-bundle: .gpu-bundle.tar.xz ($(du -h .gpu-bundle.tar.xz | cut -f1)): titan $(cat "$stage/commit"), $(ls "$stage/lib" | wc -l) libraries, 2 token shards, the CPU's curves"
