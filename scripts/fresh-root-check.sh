#!/usr/bin/env bash
# Proves the README's two commands on a clean Debian 12: in a pristine `debootstrap
# --variant=minbase bookworm` root (nothing but what a minimal Debian has), via chroot,
# 1. `bash scripts/train-default.sh` (install-deps, configure, build titan, a few training steps),
# 2. the test command's install step (`bash scripts/install-deps.sh`, which must install nothing
#    more by then), then the whole Release build that `scripts/test.sh` makes (tests, benchmarks,
#    plugins), a sanitizer-linked program (the ASan + UBSan half's toolchain) and a libFuzzer
#    target with the fuzz tree configured (scripts/fuzz.sh's toolchain).
# The tested source is a fresh clone of this repository's committed HEAD: uncommitted files do
# not leak in. Needs root, mount and chroot; the pristine root is cached (TITAN_FRESH_ROOT_CACHE,
# default /var/cache/titan/bookworm-minbase) and copied for each run into a folder that is
# unmounted and deleted at the end, failure or interrupt included.
#
# Environment:
#   TITAN_FRESH_ROOT_CACHE     the pristine root's folder (made by debootstrap when missing)
#   TITAN_FRESH_ROOT_WORKDIR   where the per-run copy goes (default: beside the cache)
#   TITAN_FRESH_ROOT_STEPS     training steps for command 1 (default 3)
#   TITAN_FRESH_ROOT_OPTIONAL  1: when not root or mount/chroot are not permitted, print
#                              "skipped: <why>" and exit 0 (otherwise that is a failure)
#   TITAN_FRESH_ROOT_SETUP     a bash snippet run in /src inside the root before command 1
#                              (to check the check, e.g. drop a package from install-deps.sh)
set -euo pipefail

suite=bookworm
cache=${TITAN_FRESH_ROOT_CACHE:-/var/cache/titan/bookworm-minbase}
cache=${cache%/}
workdir=${TITAN_FRESH_ROOT_WORKDIR:-$(dirname "$cache")}
steps=${TITAN_FRESH_ROOT_STEPS:-3}
optional=${TITAN_FRESH_ROOT_OPTIONAL:-0}
std_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { printf '== fresh-root: %s\n' "$*"; }
die() { printf '== fresh-root: FAILED: %s\n' "$*" >&2; exit 1; }
skipped=0
skip_or_fail() {
  if [ "$optional" = 1 ]; then skipped=1; say "skipped: $1"; exit 0; fi
  die "$1 (TITAN_FRESH_ROOT_OPTIONAL=1 skips this check instead)"
}

# ---- phases, each timed; the EXIT trap names the one that failed and prints the summary
phase="" phase_t0=0 t_start=$SECONDS
summary=()
begin() { phase=$1; phase_t0=$SECONDS; say "[$phase] ..."; }
ok() {
  local d=$((SECONDS - phase_t0))
  summary+=("$(printf '%5ds  %s' "$d" "$phase")")
  say "[$phase] ok (${d}s)"
  phase=""
}

# ---- cleanup: stop what runs in the root, unmount, delete the per-run copy and any partial cache
work="" root="" cache_tmp="" mounts=()
mounted_under() { # prints the mount points at or below $1
  awk -v p="$1" '$5 == p || index($5, p "/") == 1 { print $5 }' /proc/self/mountinfo
}
signal_root() { # sends $1 to every process whose root is the per-run root; false when none
  local pid r found=1
  for pid in /proc/[0-9]*; do
    r=$(readlink "$pid/root" 2>/dev/null) || continue
    if [ "$r" = "$root" ]; then kill "-$1" "${pid#/proc/}" 2>/dev/null && found=0; fi
  done
  return $found
}
remove_tree() { # deletes $1 unless something is still mounted below it
  local d=$1
  [ -n "$d" ] && [ -e "$d" ] || return 0
  if [ -n "$(mounted_under "$d")" ]; then
    echo "fresh-root: still mounted below $d, not deleting it:" >&2
    mounted_under "$d" >&2
    return 1
  fi
  rm -rf --one-file-system "$d"
}
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM HUP
  set +e
  local t_clean=$SECONDS t_phase=$((SECONDS - phase_t0))
  if [ -n "$root" ] && signal_root TERM; then
    sleep 2
    signal_root KILL && sleep 1
  fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[i]}" 2>/dev/null || umount -lR "${mounts[i]}" 2>/dev/null ||
      echo "fresh-root: could not unmount ${mounts[i]}" >&2
  done
  for i in $(mounted_under "${work:-/nonexistent}" | sort -r) \
           $(mounted_under "${cache_tmp:-/nonexistent}" | sort -r); do
    umount "$i" 2>/dev/null || umount -l "$i" 2>/dev/null
  done
  remove_tree "$work" || rc=1
  remove_tree "$cache_tmp" || rc=1
  [ -n "$cache_tmp" ] && rm -f "$cache_tmp.log"
  [ "$skipped" = 1 ] && exit 0
  if [ ${#summary[@]} -gt 0 ]; then
    say "summary (seconds per phase)"
    for i in "${summary[@]}"; do echo "   $i"; done
    printf '   %5ds  %s\n' $((SECONDS - t_clean)) "cleanup: unmount, delete the per-run copy"
  fi
  if [ "$rc" -ne 0 ]; then
    if [ -n "$phase" ]; then
      say "FAILED in [$phase] after ${t_phase}s (exit $rc); total $((SECONDS - t_start))s" >&2
    else
      say "FAILED (exit $rc); total $((SECONDS - t_start))s" >&2
    fi
  else
    say "passed; total $((SECONDS - t_start))s"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

in_root() { # runs a bash snippet in /src inside the root, with a clean environment
  local env=(HOME=/root "PATH=$std_path" LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive TERM=dumb)
  local v
  for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!v:-}" ]; then env+=("$v=${!v}"); fi
  done
  env -i "${env[@]}" chroot "$root" /bin/bash -euo pipefail -c "cd /src && $1" < /dev/null
}
stamp() { # prefixes each line with the seconds since the phase began
  local line
  while IFS= read -r line; do printf '[%4ds] %s\n' $((SECONDS - phase_t0)) "$line"; done
}
run_in_root() { # in_root with its output stamped, in the background so that a signal reaches
  # the trap at once (which then stops what runs in the root)
  { in_root "$1" 2>&1 | stamp; } &
  wait $!
}

# ---------------------------------------------------------------------------------------------
begin "preflight: root, mount, chroot, debootstrap"
[ "$(id -u)" -eq 0 ] || skip_or_fail "needs root (uid $(id -u)): it mounts and chroots"
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
head=$(git -C "$top" rev-parse HEAD)
probe=$(mktemp -d)
if ! mount -t proc proc "$probe" 2>/dev/null; then
  rmdir "$probe"
  skip_or_fail "mounting is not permitted here (mount -t proc failed)"
fi
umount "$probe"
rmdir "$probe"
chroot / /bin/true 2>/dev/null || skip_or_fail "chroot is not permitted here"
if ! command -v debootstrap > /dev/null; then
  say "installing debootstrap"
  pkgs=(debootstrap debian-archive-keyring gpgv)
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" > /dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } ||
    die "could not install debootstrap"
fi
mirror=""
if [ -r /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
fi
mirror=${mirror:-http://deb.debian.org/debian}
dirty=""
git -C "$top" diff --quiet HEAD 2>/dev/null || dirty=" (its uncommitted changes are NOT tested)"
say "testing $top at $head$dirty"
ok

# ---------------------------------------------------------------------------------------------
mkdir -p "$(dirname "$cache")" "$workdir"
exec 9> "$cache.lock"
flock 9
for d in "$cache".tmp.*; do # left by a run that was killed while it ran debootstrap
  if [ -d "$d" ] && [ -z "$(mounted_under "$d")" ]; then rm -rf --one-file-system "$d"; fi
  if [ -f "$d" ]; then rm -f "$d"; fi
done
if [ -d "$cache" ]; then
  begin "pristine root: cached in $cache"
else
  begin "pristine root: debootstrap --variant=minbase $suite from $mirror"
  cache_tmp=$(mktemp -d "$cache.tmp.XXXXXX")
  if ! debootstrap --variant=minbase "$suite" "$cache_tmp" "$mirror" > "$cache_tmp.log" 2>&1; then
    tail -n 30 "$cache_tmp.log" >&2
    die "debootstrap failed"
  fi
  rm -f "$cache_tmp.log"
  [ -z "$(mounted_under "$cache_tmp")" ] || die "debootstrap left mounts below $cache_tmp"
  chmod 755 "$cache_tmp"
  mv -T "$cache_tmp" "$cache"
  cache_tmp=""
fi
flock -u 9
ok

# ---------------------------------------------------------------------------------------------
begin "per-run copy, apt config, mounts, clone"
work=$(realpath "$(mktemp -d "$workdir/fresh-root-run.XXXXXX")")
root=$work/root
cp -a --reflink=auto "$cache" "$root"
rm -f "$root/etc/resolv.conf"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# apt reaches the same mirror as this machine's apt, when this machine is Debian 12 too
codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2> /dev/null || true)
if [ "$codename" = "$suite" ]; then
  shopt -s nullglob
  host_sources=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list)
  if [ -s /etc/apt/sources.list ] || [ ${#host_sources[@]} -gt 0 ]; then
    rm -f "$root/etc/apt/sources.list"
    if [ -s /etc/apt/sources.list ]; then cp /etc/apt/sources.list "$root/etc/apt/"; fi
    if [ ${#host_sources[@]} -gt 0 ]; then cp "${host_sources[@]}" "$root/etc/apt/sources.list.d/"; fi
  fi
  for f in /etc/apt/trusted.gpg.d/* /etc/apt/keyrings/*; do
    mkdir -p "$root$(dirname "$f")"
    cp "$f" "$root$f"
  done
  # the host's Acquire settings (a proxy, a snapshot mirror's date checks) and nothing else
  for f in /etc/apt/apt.conf.d/*; do
    if grep -q '^[[:space:]]*Acquire::' "$f"; then cp "$f" "$root/etc/apt/apt.conf.d/"; fi
  done
  shopt -u nullglob
else
  say "this machine is not Debian $suite: the root keeps debootstrap's sources ($mirror)"
fi
mount -t proc proc "$root/proc"
mounts+=("$root/proc")
mount --rbind /dev "$root/dev"
mounts+=("$root/dev")
mount --make-rslave "$root/dev"
mount --bind /sys "$root/sys"
mounts+=("$root/sys")
mount --make-rslave "$root/sys"
mount -o remount,bind,ro "$root/sys" 2> /dev/null || true
git clone --quiet --no-hardlinks "$top" "$root/src"
git -C "$root/src" -c advice.detachedHead=false checkout --quiet --detach "$head"
ok

if [ -n "${TITAN_FRESH_ROOT_SETUP:-}" ]; then
  begin "setup hook (TITAN_FRESH_ROOT_SETUP)"
  run_in_root "$TITAN_FRESH_ROOT_SETUP"
  ok
fi

# ---------------------------------------------------------------------------------------------
cmd1="bash scripts/train-default.sh --training.steps $steps --metrics.log_freq 1"
begin "README command 1: $cmd1"
run_in_root "$cmd1"
# the example plugins come with the first command (docs/extending.md uses them)
run_in_root "ls build/plugins/libtitan_layout_rope.so build/plugins/libtitan_token_experts.so"
ok

# ---------------------------------------------------------------------------------------------
begin "README command 2, install step: bash scripts/install-deps.sh (must install nothing)"
run_in_root "bash scripts/install-deps.sh" > "$work/install-deps.out" ||
  { cat "$work/install-deps.out"; exit 1; }
cat "$work/install-deps.out"
if grep -q '^\[ *[0-9]*s\] installing:' "$work/install-deps.out"; then
  die "scripts/install-deps.sh installed packages after scripts/train-default.sh had run it"
fi
ok

# ---------------------------------------------------------------------------------------------
begin "README command 2: Release build of every target (tests, benchmarks, plugins)"
run_in_root "bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release"
ok

# ---------------------------------------------------------------------------------------------
begin "README command 2: ASan + UBSan toolchain (a sanitized program builds and runs)"
# shellcheck disable=SC2016 # expanded inside the root
run_in_root 'd=$(mktemp -d) && echo "int main() { int a[2] = {0, 1}; return a[0]; }" > $d/a.cpp &&
  c++ -std=c++20 -fsanitize=address,undefined -fno-omit-frame-pointer $d/a.cpp -o $d/a &&
  ASAN_OPTIONS=detect_leaks=0 $d/a &&
  rm -rf $d'
ok

# ---------------------------------------------------------------------------------------------
begin "README command 2: libFuzzer toolchain (clang builds and runs a target; the fuzz tree configures)"
# shellcheck disable=SC2016 # expanded inside the root
run_in_root 'd=$(mktemp -d) && printf "%s\n" "#include <cstddef>" "#include <cstdint>" \
    "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }" > $d/f.cpp &&
  clang++ -fsanitize=fuzzer,address,undefined $d/f.cpp -o $d/f && $d/f -runs=100 2> /dev/null &&
  cmake -S . -B $d/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTITAN_FUZZ=ON \
    -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_BENCHMARKS=OFF > /dev/null &&
  rm -rf $d'
ok
