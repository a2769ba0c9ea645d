#!/usr/bin/env bash
# Several fake nodes on one machine: network namespaces on a private bridge (10.77.0.0/24) that reaches
# nothing else, mpirun started from a "head" namespace that owns the bridge, ranks started on the nodes by
# netns_rsh.sh (each node with its own hostname). Runs the named checks with 2 nodes x 2 ranks and removes
# the namespaces, the bridge and every process it started, also when a check fails or is interrupted.
#   tests/cluster/netns_fixture.sh --build BUILD_DIR CHECK...      (checks listed in usage() below)
#   tests/cluster/netns_fixture.sh --build build run @MPIRUN@ -np 4 build/meshtrain version
# Nothing is created outside the fixture's own namespaces; needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
# SPDX-License-Identifier: MIT
set -uo pipefail
# shellcheck disable=SC2034 # used by lib.sh
MT_FIXTURE=netns
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
source "$HERE/lib.sh"

usage() {
    cat >&2 <<EOF
usage: $0 --build BUILD_DIR [--nodes N] [--ppn N] CHECK... | run CMD...
checks:
  world        test_rt_world and mt_nodecheck on N nodes x 2 ranks: n_nodes = N, local size 2, local ranks
               equal Open MPI's, hostnames equal within a node and distinct across nodes
  topo_auto    meshtrain topo --json with tp=2, parallel.order=auto: nodes, hosts, local ranks per node, and
               every tp group inside one node (tests/cluster/check_topo_json.py)
  topo_cross   the same with order dp-tp-pp: tp groups must span nodes (the checker sees a bad layout)
  train_match ARGS...
               meshtrain train ARGS on N nodes x PPN ranks reaches the final loss of the same job in one
               process (tp = pp = 1), to 1e-4 relative
  run CMD...   any command; @MPIRUN@ becomes the full mpirun prefix (hostfile, agent, interfaces, binding),
               @MESHTRAIN@ the meshtrain binary, @BUILD@ the build directory; \$MT_NETNS_MPIRUN holds the prefix too
Environment: MT_CLUSTER_BUDGET (seconds for the whole run, default 150).
EOF
    exit 2
}

BUILD=
NNODES=2
PPN=2 # ranks per fake node
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$(cd "$2" && pwd) || mt_fail "no build directory $2"; shift 2 ;;
    --nodes) NNODES=$2; shift 2 ;;
    --ppn) PPN=$2; shift 2 ;;
    -h | --help) usage ;;
    *) break ;;
    esac
done
[ -n "$BUILD" ] && [ $# -gt 0 ] || usage
[ "$NNODES" -ge 1 ] && [ "$NNODES" -le 8 ] || mt_fail "--nodes must be 1..8"
[ "$PPN" -ge 1 ] && [ "$PPN" -le 8 ] || mt_fail "--ppn must be 1..8"
MESHTRAIN=$BUILD/meshtrain
NODECHECK=$BUILD/tests/cluster/mt_nodecheck
RT_WORLD=$BUILD/tests/runtime/test_rt_world
BUDGET=${MT_CLUSTER_BUDGET:-150}
NP=$((NNODES * PPN))

for b in ip unshare mpirun hostname python3; do
    command -v "$b" >/dev/null || mt_skip "$b not found (ip: iproute2, unshare: util-linux, mpirun: openmpi-bin, python3)"
done
mpirun --version 2>&1 | grep -q "Open MPI" || mt_skip "mpirun is not Open MPI (the fixture drives Open MPI's rsh launcher)"

# ---- namespaces and clean-up --------------------------------------------------------------------------------
# Names carry this shell's PID: several runs (ctest -j, other users) can coexist; each uses the same subnet
# in its own namespaces, which never meet.
P=mt$$
HEAD=${P}h
NODES=()
for i in $(seq 0 $((NNODES - 1))); do NODES+=("${P}n$i"); done
D=$(mktemp -d "${TMPDIR:-/tmp}/mt-netns.XXXXXX")
export MT_CLUSTER_TAG=$D
CREATED=()
RC=0
CHECK_PID= # the running check: a background subshell, so that signals interrupt `wait` at once

cleanup() {
    local rc=$? ns pids left
    trap - EXIT INT TERM HUP
    [ $RC -ne 0 ] && rc=$RC
    mt_stop_check
    # Processes inside the namespaces first (ranks, orteds), then everything else this run started.
    for ns in "${CREATED[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
    done
    mt_stop_watchdog
    if ! mt_reap_tagged "$MT_CLUSTER_TAG"; then
        echo "FAIL: processes of this run were still alive after it (listed above)" >&2
        [ $rc -eq 0 ] && rc=1
    fi
    ip -n "$HEAD" link del br0 2>/dev/null
    for ns in "${CREATED[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null || ip netns del "$ns"
    done
    left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${P}[hn]" || true)
    if [ -n "$left" ]; then
        echo "FAIL: namespaces left behind: $left" >&2
        [ $rc -eq 0 ] && rc=1
    fi
    rm -rf "$D"
    exit $rc
}
# Namespaces of earlier runs that were killed outright (SIGKILL leaves no chance to clean up): named after
# a PID that no longer exists.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mt[0-9]+[hn][0-9]*$'); do
    pid=$(echo "$ns" | sed -E 's/^mt([0-9]+)[hn][0-9]*$/\1/')
    if ! kill -0 "$pid" 2>/dev/null; then
        mt_log "removing namespace $ns left by an earlier run (pid $pid is gone)"
        ip -n "$ns" link del br0 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    fi
done
mt_arm_fixture cleanup "$BUDGET"

# The one place the machine may refuse: creating a namespace. That is a skip with the kernel's reason.
if ! err=$(ip netns add "$HEAD" 2>&1); then
    case $err in
    *"Permission denied"* | *"Operation not permitted"*)
        mt_skip "this machine forbids network namespaces ($err); the fake-node tests need root/CAP_SYS_ADMIN" ;;
    *) mt_fail "ip netns add $HEAD: $err" ;;
    esac
fi
CREATED+=("$HEAD")
if ! err=$(ip netns exec "$HEAD" unshare --uts true 2>&1); then
    case $err in
    *"Permission denied"* | *"Operation not permitted"*) mt_skip "this machine forbids UTS namespaces ($err)" ;;
    *) mt_fail "unshare --uts in $HEAD: $err" ;;
    esac
fi

# The bridge lives in the head namespace (the "switch" and login node, 10.77.0.1); each node's eth0 is a
# veth whose other end is a bridge port. The subnet is the only route anywhere: traffic stays between them.
ip -n "$HEAD" link set lo up || mt_fail "lo up in $HEAD"
ip -n "$HEAD" link add br0 type bridge || mt_fail "cannot create the bridge"
ip -n "$HEAD" addr add 10.77.0.1/24 dev br0 || mt_fail "cannot address the bridge"
ip -n "$HEAD" link set br0 up || mt_fail "bridge up"
HOSTFILE=$D/hostfile
: >"$HOSTFILE"
MAP=
for i in $(seq 0 $((NNODES - 1))); do
    ns=${NODES[$i]}
    addr=10.77.0.$((11 + i))
    ip netns add "$ns" || mt_fail "ip netns add $ns"
    CREATED+=("$ns")
    ip -n "$HEAD" link add "p$i" type veth peer name eth0 netns "$ns" || mt_fail "veth for $ns"
    ip -n "$HEAD" link set "p$i" master br0 up || mt_fail "bridge port p$i"
    ip -n "$ns" link set lo up || mt_fail "lo up in $ns"
    ip -n "$ns" addr add "$addr/24" dev eth0 || mt_fail "address $addr in $ns"
    ip -n "$ns" link set eth0 up || mt_fail "eth0 up in $ns"
    echo "$addr slots=$PPN" >>"$HOSTFILE"
    MAP="$MAP $addr=$ns:mt-node$i"
done
export MT_NETNS_HOSTS=${MAP# }

# Every node must reach the head (where mpirun listens) before launching: bounded wait on TCP connect.
reach() { ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/10.77.0.1/$2" 2>/dev/null; }
PROBE_PORT=$(mt_free_port)
ip netns exec "$HEAD" timeout 30 python3 -c "
import socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('10.77.0.1', $PROBE_PORT)); s.listen(16)
s.settimeout(30)
for _ in range($NNODES):
    c,_=s.accept(); c.close()
" &
PROBE=$!
sleep 0.3
for ns in "${NODES[@]}"; do
    mt_wait_until 15 "$ns to reach 10.77.0.1 over the bridge" reach "$ns" "$PROBE_PORT"
done
wait $PROBE || mt_fail "connectivity probe on the head failed"
mt_log "$NNODES fake nodes up in $SECONDS s: $(cat "$HOSTFILE" | tr '\n' ' ')"

# ---- mpirun -------------------------------------------------------------------------------------------------
# No Slurm variables: Open MPI would otherwise launch through Slurm instead of the agent.
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
# Idle OpenMP workers of oversubscribed ranks sleep instead of spinning (as the rest of the test suite runs
# them); the fake nodes inherit mpirun's environment through netns_rsh.sh.
export OMP_WAIT_POLICY=passive
# launch/mpirun.sh (what users run) adds --bind-to none, --map-by ppr:PPN:node and the root flag; the
# fixture adds the fake cluster's specifics: the agent that enters a node, and the bridge's subnet.
# shellcheck disable=SC2054 # the commas belong to Open MPI's list of transports
MPIRUN_CORE=(ip netns exec "$HEAD" unshare --uts -- sh -c 'hostname mt-head && exec "$@"' sh
        "$SRC/launch/mpirun.sh" --ppn "$PPN" --hostfile "$HOSTFILE"
        --mca plm_rsh_agent "$HERE/netns_rsh.sh" --mca plm_rsh_no_tree_spawn 1
        --mca btl self,vader,tcp --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24
        -x OMPI_MCA_mpi_yield_when_idle=1 -x MT_CLUSTER_TAG)
MPIRUN=(timeout -k 5 60 "${MPIRUN_CORE[@]}")
export MT_NETNS_MPIRUN="${MPIRUN_CORE[*]}"

check_world() {
    "${MPIRUN[@]}" -np "$NP" "$RT_WORLD" || return 1
    "${MPIRUN[@]}" -np "$NP" "$NODECHECK" --nodes "$NNODES" --local-size "$PPN" --launcher openmpi \
        >"$D/nodecheck.out" 2>&1 || { cat "$D/nodecheck.out"; return 1; }
    cat "$D/nodecheck.out"
    [ "$(grep -c '^nodecheck rank' "$D/nodecheck.out")" -eq "$NP" ] || { echo "expected $NP ranks to report"; return 1; }
    local i
    for i in $(seq 0 $((NNODES - 1))); do
        [ "$(grep -c "host mt-node$i " "$D/nodecheck.out")" -eq "$PPN" ] ||
            { echo "expected $PPN ranks on mt-node$i"; return 1; }
    done
}

# topo_json FILE ARGS...: meshtrain topo --json on every rank of every node (rank 0 writes the JSON).
topo_json() {
    local file=$1
    shift
    "${MPIRUN[@]}" -np "$NP" "$MESHTRAIN" topo --json "$@" >"$file" || { cat "$file"; return 1; }
}

check_topo_auto() {
    topo_json "$D/topo_auto.json" --parallel.tp=$PPN --parallel.order=auto || return 1
    python3 "$HERE/check_topo_json.py" "$D/topo_auto.json" --nodes "$NNODES" --ranks-per-node "$PPN" --tp "$PPN" \
        --tp-in-node
}

# The opposite layout (dp fastest) must put tp partners on different nodes, and the checker must see it.
check_topo_cross() {
    topo_json "$D/topo_cross.json" --parallel.tp=$PPN --parallel.order=dp-tp-pp || return 1
    python3 "$HERE/check_topo_json.py" "$D/topo_cross.json" --nodes "$NNODES" --ranks-per-node "$PPN" --tp "$PPN" \
        --expect-tp-cross
}

# final_loss FILE: the "final loss X" that meshtrain train prints last.
final_loss() { sed -n 's/^done: .*final loss \([-0-9.e+]*\).*/\1/p' "$1" | tail -1; }

check_train_match() {
    "$MESHTRAIN" train "$@" --parallel.tp=1 --parallel.pp=1 >"$D/train_ref.out" 2>&1 ||
        { cat "$D/train_ref.out"; return 1; }
    "${MPIRUN[@]}" -np "$NP" "$MESHTRAIN" train "$@" >"$D/train_dist.out" 2>&1 || { cat "$D/train_dist.out"; return 1; }
    local ref dist
    ref=$(final_loss "$D/train_ref.out")
    dist=$(final_loss "$D/train_dist.out")
    grep -E '^(meshtrain train|done):' "$D/train_dist.out"
    echo "final loss: one process $ref, $NP ranks on $NNODES nodes $dist"
    [ -n "$ref" ] && [ -n "$dist" ] || { echo "no final loss in the output"; return 1; }
    python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-4 * max(1.0, abs(a)))" \
        "$ref" "$dist" || { echo "final losses differ by more than 1e-4 relative"; return 1; }
}

check_run() {
    local args=() a
    for a in "$@"; do
        if [ "$a" = @MPIRUN@ ]; then
            args+=("${MPIRUN_CORE[@]}") # the whole command gets one timeout below
            continue
        fi
        a=${a//@MESHTRAIN@/$MESHTRAIN}
        args+=("${a//@BUILD@/$BUILD}")
    done
    timeout -k 5 90 "${args[@]}"
}

mt_run_checks "run train_match" "$@"
