#!/usr/bin/env bash
# Configures and builds one build tree. usage: scripts/build.sh DIR [cmake args...] [-- targets...]
set -euo pipefail
dir=$1; shift
cmake_args=(); targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; targets=("$@"); break; fi
  cmake_args+=("$1"); shift
done
cmake -S "$(dirname "$0")/.." -B "$dir" -G Ninja "${cmake_args[@]}" >/dev/null
ninja -C "$dir" "${targets[@]}"
