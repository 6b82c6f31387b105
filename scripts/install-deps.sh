#!/usr/bin/env bash
# Installs the Debian packages titan.cpp builds and runs with. Safe to run repeatedly.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libdnnl-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev libbenchmark-dev fortunes libpcre2-dev libutf8proc-dev
      libtomlplusplus-dev ocl-icd-opencl-dev libxxhash-dev zlib1g-dev libopenmpi-dev openmpi-bin
      clang libclang-rt-14-dev libomp-14-dev)  # clang: the libFuzzer targets (scripts/fuzz.sh)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
