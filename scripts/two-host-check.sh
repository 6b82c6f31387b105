#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2, nothing else reachable from them), with OpenMPI reaching the second through
# plm_rsh_agent (a script that runs the command inside its namespace: no sshd) and the ranks
# talking TCP over the veth only (--mca btl tcp,self, interfaces pinned to 10.77.0.0/24).
# Checks, on a small Qwen3 (2 layers, dim 64, batches of 2 × 64 tokens):
#   1. FSDP 2 (one rank per host) and FSDP 2 × TP 2 (two per host) give the one-host losses of
#      12 steps, bit for bit;
#   2. a host lost: SIGKILL of the remote rank, then taking the veth down, each right after the
#      first checkpoint of a 60-step FSDP 2 run that saves a sharded checkpoint every 3 steps,
#      ends the whole job within LOST_BOUND seconds (60) with a message naming the lost host;
#   3. the last committed checkpoint, written across the hosts, resumes on one host, and the
#      steps after it are bit for bit those of the uninterrupted run.
# Namespaces, links and processes are removed on any exit. Without root or network namespaces
# the script says why and exits 0 (skipped).
#
#   scripts/two-host-check.sh [BUILD_DIR=build]
set -euo pipefail
build="${1:-build}"
titan="$(cd "$(dirname "$build/titan")" && pwd)/titan"
bound="${LOST_BOUND:-60}"
say() { echo "two-host: $*"; }
skip() { say "skipped: $*"; exit 0; }
fail() { say "FAILED: $*"; exit 1; }

[ -x "$titan" ] || fail "no $titan (build first: scripts/build.sh $build)"
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root (uid $(id -u))"
command -v ip > /dev/null || skip "no 'ip' command (Debian package iproute2)"
command -v mpirun > /dev/null || skip "no mpirun (scripts/install-deps.sh installs OpenMPI)"

tag=$$
ns1="titan-h1-$tag" ns2="titan-h2-$tag"
veth1="tth1-$tag" veth2="tth2-$tag"
veth1="${veth1:0:15}" veth2="${veth2:0:15}"  # interface names hold at most 15 characters
work="$(mktemp -d)"
cleanup() {
  for ns in "$ns1" "$ns2"; do
    pids=$(ip netns pids "$ns" 2> /dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2> /dev/null || true
  done
  ip netns del "$ns1" 2> /dev/null || true
  ip netns del "$ns2" 2> /dev/null || true  # takes the veth pair with it
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$ns1" 2> "$work/err" || skip "network namespaces cannot be made here ($(cat "$work/err"))"
ip netns add "$ns2"
ip link add "$veth1" type veth peer name "$veth2" 2> "$work/err" ||
  skip "a veth pair cannot be made here ($(cat "$work/err"))"
ip link set "$veth1" netns "$ns1"
ip link set "$veth2" netns "$ns2"
ip -n "$ns1" addr add 10.77.0.1/24 dev "$veth1"
ip -n "$ns2" addr add 10.77.0.2/24 dev "$veth2"
for ns in "$ns1" "$ns2"; do ip -n "$ns" link set lo up; done
ip -n "$ns1" link set "$veth1" up
ip -n "$ns2" link set "$veth2" up
say "hosts: 10.77.0.1 (namespace $ns1), 10.77.0.2 (namespace $ns2), joined by a veth pair"

# OpenMPI's remote launcher, called as ssh would be: [options] HOST COMMAND...
agent="$work/agent.sh"
cat > "$agent" << EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host="\$1"; shift
case "\$host" in
  10.77.0.1) ns=$ns1 ;;
  10.77.0.2) ns=$ns2 ;;
  *) echo "two-host agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$agent"

model=(--config qwen3_debugmodel --model.n_layers 2 --model.dim 64 --model.n_heads 4
       --model.n_kv_heads 2 --model.head_dim 16 --model.hidden_dim 128 --training.seq_len 64
       --training.local_batch_size 2 --training.steps 12 --lr_scheduler.warmup_steps 2
       --metrics.log_freq 1 --metrics.peak_flops 1e12)
# Keepalive on mpirun's links to its remote daemons: a silent host is noticed in about
# 5 + 2 × 4 s instead of OpenMPI's default 300 + 20 × 9 s.
mca=(--mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
     --mca plm_rsh_agent "$agent" --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2
     --mca oob_tcp_keepalive_probes 4)
mpi=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)

# one_host NP DUMP [flags]: NP ranks on this machine's own network stack.
one_host() {
  local np=$1 dump=$2; shift 2
  timeout 300 "${mpi[@]}" -np "$np" "$titan" train "${model[@]}" --dump_folder "$dump" "$@" \
    > "$dump.log" 2>&1 || { tail -30 "$dump.log"; fail "the one-host run $dump failed"; }
}
# two_hosts NP DUMP [flags]: NP/2 ranks on each host, started from the first.
two_hosts_bg() {
  local np=$1 dump=$2; shift 2
  ip netns exec "$ns1" timeout 300 "${mpi[@]}" "${mca[@]}" -np "$np" \
    --host "10.77.0.1:$((np / 2)),10.77.0.2:$((np / 2))" \
    "$titan" train "${model[@]}" --dump_folder "$dump" "$@" > "$dump.log" 2>&1
}
two_hosts() {
  two_hosts_bg "$@" || { tail -30 "$2.log"; fail "the two-host run $2 failed"; }
}
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
same_losses() {  # same_losses A B WHAT: every step's loss of B equals A's, bit for bit
  [ -s "$1/metrics.jsonl" ] && [ -s "$2/metrics.jsonl" ] || fail "$3: no metrics"
  if ! diff <(losses "$1") <(losses "$2") > "$work/diff"; then
    cat "$work/diff"
    fail "$3: the losses differ"
  fi
  say "$3: $(losses "$2" | wc -l) steps, losses equal bit for bit (last $(losses "$2" | tail -1))"
}

# 1. The same losses over the network as on one host.
one_host 2 "$work/fsdp-one" --parallelism.data_parallel_shard_degree 2
two_hosts 2 "$work/fsdp-two" --parallelism.data_parallel_shard_degree 2
same_losses "$work/fsdp-one" "$work/fsdp-two" "FSDP 2 across two hosts vs one host"
one_host 4 "$work/tp-one" --parallelism.data_parallel_shard_degree 2 \
  --parallelism.tensor_parallel_degree 2
two_hosts 4 "$work/tp-two" --parallelism.data_parallel_shard_degree 2 \
  --parallelism.tensor_parallel_degree 2
same_losses "$work/tp-one" "$work/tp-two" "FSDP 2 x TP 2 across two hosts (TP inside each) vs one host"

# 2 and 3. A host lost mid-run; the last committed checkpoint resumes on one host.
ck=(--parallelism.data_parallel_shard_degree 2 --checkpoint.enable --checkpoint.interval 3
    --training.steps 60)
one_host 2 "$work/ref" "${ck[@]}"
lose_host() {  # lose_host HOW: kill (SIGKILL of the remote rank) or link (its veth taken down)
  local how=$1 dump="$work/lost-$1"
  two_hosts_bg 2 "$dump" "${ck[@]}" &
  local job=$!
  for _ in $(seq 600); do  # until the first checkpoint is committed
    [ -d "$dump/checkpoint/step-3" ] && break
    kill -0 $job 2> /dev/null || break
    sleep 0.05
  done
  [ -d "$dump/checkpoint/step-3" ] || { tail -30 "$dump.log"; fail "$how: no checkpoint was committed"; }
  if [ "$how" = kill ]; then
    local victim=""
    for p in $(ip netns pids "$ns2"); do
      [ "$(cat "/proc/$p/comm" 2> /dev/null)" = titan ] && victim=$p
    done
    [ -n "$victim" ] || fail "kill: no titan rank runs on 10.77.0.2"
    kill -9 "$victim"
  else
    ip -n "$ns2" link set "$veth2" down
  fi
  local t0=$SECONDS rc=0
  wait $job || rc=$?
  local took=$((SECONDS - t0))
  [ $rc -ne 0 ] || fail "$how: the job ended with status 0 although a host was lost"
  ((took <= bound)) || fail "$how: the job took $took s to end (bound $bound s)"
  grep -q "10.77.0.2" "$dump.log" || { tail -30 "$dump.log"; fail "$how: no message names 10.77.0.2"; }
  local msg
  msg=$(grep -m1 -E "exited on signal|Remote daemon" "$dump.log" | tr -s ' ')
  say "$how: the job ended $took s after the host was lost (bound $bound s), exit status $rc: $msg"
  # Nothing of the job may still run on either host when it resumes.
  for _ in $(seq 200); do
    [ -z "$(ip netns pids "$ns1")$(ip netns pids "$ns2")" ] && break
    sleep 0.1
  done
  for ns in "$ns1" "$ns2"; do
    pids=$(ip netns pids "$ns")
    [ -z "$pids" ] || { say "$how: killing what is left in $ns: $pids"; kill -9 $pids || true; }
  done
  [ "$how" = kill ] || ip -n "$ns2" link set "$veth2" up
  local last
  last=$(find "$dump/checkpoint" -maxdepth 1 -name 'step-*' | grep -E '/step-[0-9]+$' |
    sed 's/.*step-//' | sort -n | tail -1)
  ((last < 60)) || fail "$how: the run finished before the host was lost"
  say "$how: $(losses "$dump" | wc -l) step(s) logged before; the last committed checkpoint is step-$last"
  one_host 2 "$dump" "${ck[@]}"  # resumes from it, on one host
  same_losses "$work/ref" "$dump" "$how: resumed from step-$last on one host vs the uninterrupted run"
}
lose_host kill
lose_host link
say "all checks passed"
