#!/usr/bin/env bash
# Fails when a source folder includes a titan folder it must not (the layering of
# ../shared/design/architecture.md): core <- ops <- models <- train / checkpoint; config knows no
# model; the plugin ABI (plugin/plugin_api.h) depends on core, ops and config only; dist/ (the
# communicators and the parallel layout) knows no model and no kernel; parallel/ (FSDP, tensor,
# expert and loss parallelism) wraps a model through its interface, and the trainer installs it:
# the model never sees it, and names no communicator or device; tools/ (plot, memory plan,
# check-kernel) sit beside the training loop; infer/ (generation) uses a model through its
# interface, as train/ does, and knows no kernel. Devices differ only through their records
# (ops/device.h): outside them and builtins.cpp no code compares a device's name.
# usage: scripts/check-layering.sh   (from anywhere; prints each violation, exits 1 if any)
set -euo pipefail
cd "$(dirname "$0")/../src/titan"
# folder (or file) -> titan folders it may include besides itself
declare -A allowed=(
  [core]=""
  [ops]="core"
  [config]="core"
  [data]="core"
  [dist]="core config"
  [optim]="core ops"
  [plugin]="core ops config"
  [models]="core ops config plugin"
  [checkpoint]="core config models/model.h"
  [parallel]="core ops config dist checkpoint models/model.h models/tensor_parallel.h models/context_parallel.h"
  [train]="core ops config data optim plugin checkpoint dist parallel tools/memory_plan.h models/model.h models/tensor_parallel.h models/registry.h"
  [tools]="core ops config dist plugin models/model.h models/registry.h"
  [infer]="core config data checkpoint models/model.h models/registry.h"
  [cli]="*"
  [builtins.cpp]="*"
)
# Deliberate exceptions, each with its reason.
declare -A exceptions=(
  # check-kernel compares the kernels of Qwen3's op plans on Qwen3's shapes.
  [tools/check_kernel.cpp]="models/qwen3"
)
bad=0
while IFS= read -r f; do
  top=${f%%/*}
  rules=${allowed[$top]-}
  [ "$rules" = "*" ] && continue
  while IFS= read -r inc; do
    target=${inc#titan/}
    [ "${target%%/*}" = "$top" ] && continue
    ok=0
    for r in $rules ${exceptions[$f]-}; do
      case "$target" in "$r"|"$r"/*) ok=1 ;; esac
    done
    if [ $ok = 0 ]; then
      echo "layering: src/titan/$f includes $inc ($top/ may include: ${rules:-nothing outside core})"
      bad=1
    fi
  done < <(sed -n 's/^#include "\(titan\/[^"]*\)".*/\1/p' "$f")
done < <(find . -name '*.h' -o -name '*.cpp' -o -name '*.cu' | sed 's|^\./||' | sort)
# The model computes through a backend: it names no communicator and no device.
if grep -rn -E 'Communicator|"cuda"|\bnccl|\bMPI_' models; then
  echo "layering: models/ names a communicator or a device (above)"
  bad=1
fi
# A model's compute reads no rank: the parallel plan (models/tensor_parallel.h, a model's
# parallelize step) turns ranks into the slices and rows it holds.
if grep -rn -E '\.(ep_)?rank\b' models/qwen3 | grep -v -E '^models/qwen3/parallelize\.(h|cpp):'; then
  echo "layering: a model reads a rank (above); ask its TpSlice for the rows it holds instead"
  bad=1
fi
# Devices differ through their records (ops/device.h, registered in builtins.cpp): no code
# compares a device's name.
if grep -rn -E '[=!]= *"(cpu|cuda)"|"(cpu|cuda)" *[=!]=' --include='*.h' --include='*.cpp' \
  --include='*.cu' . | grep -v -E '^\./(builtins\.cpp|ops/device\.cpp|ops/cuda/)'; then
  echo "layering: a device named in a comparison (above); give its record the property instead"
  bad=1
fi
[ $bad = 0 ] && echo "layering: ok"
exit $bad
