#!/usr/bin/env bash
# Thin wrapper around Open MPI's mpirun for meshtrain: ranks per node, no binding by mpirun (meshtrain
# places ranks and threads itself), meshtrain's and NCCL's environment forwarded to every node, and the
# root/oversubscribe flags only where they are needed.
#   launch/mpirun.sh [--ppn N] [--hostfile FILE | --host LIST] [-n|--np N] [mpirun options...] COMMAND...
# Examples:
#   launch/mpirun.sh --ppn 8 --hostfile hosts meshtrain train cfg.toml        # 8 ranks (GPUs) per node
#   launch/mpirun.sh -n 4 meshtrain bench coll                                # 4 ranks on this machine
#   launch/mpirun.sh --ppn 4 --hostfile hosts --mca btl_tcp_if_include ib0 meshtrain train cfg.toml
# The wrapper's own options come first; everything from the first other argument on goes to mpirun
# unchanged (more mpirun options, then the command). $MPIRUN names the mpirun binary (default mpirun).
# Prints the full mpirun command line on stderr before running it. See docs/launching.md.
# SPDX-License-Identifier: MIT
set -euo pipefail

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

ppn=
np=
hostfile=
hosts=
while [ $# -gt 0 ]; do
    case $1 in
    --ppn | -N) ppn=$2; shift 2 ;;
    --np | -n | -np) np=$2; shift 2 ;;
    --hostfile | -hostfile | --machinefile) hostfile=$2; shift 2 ;;
    --host | -H) hosts=$2; shift 2 ;;
    -h | --help) usage ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || usage

args=()
[ -n "$np" ] && args+=(-np "$np")
[ -n "$hostfile" ] && args+=(--hostfile "$hostfile")
[ -n "$hosts" ] && args+=(--host "$hosts")
# N ranks on each node, in node order: consecutive ranks share a node, which meshtrain's mesh layout
# (parallel.order) relies on to keep tensor-parallel groups inside a node.
[ -n "$ppn" ] && args+=(--map-by "ppr:$ppn:node")
# No binding from mpirun: meshtrain binds each rank to the cores near its GPU (hwloc) itself; mpirun's
# default (--bind-to core for <= 2 ranks, socket otherwise) would pin every rank to a slice it did not choose.
args+=(--bind-to none)

# Open MPI refuses to run as root unless told; containers and CI often are root.
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)

# More ranks than cores on a single machine (a laptop, CI): allow it, and make idle ranks yield instead of
# busy-polling the cores the working ranks need. On multi-node runs the hostfile's slots decide.
if [ -z "$hostfile" ] && [ -z "$hosts" ] && [ -n "$np" ] && [ "$np" -gt "$(nproc)" ]; then
    args+=(--oversubscribe -x OMPI_MCA_mpi_yield_when_idle=1)
    export OMPI_MCA_mpi_yield_when_idle=1
fi

# meshtrain's knobs and NCCL's settings must be the same on every rank: forward what is set here
# (OMPI_MCA_* variables are forwarded by mpirun itself).
for name in $(compgen -e); do
    case $name in
    MESHTRAIN_* | NCCL_*) args+=(-x "$name") ;;
    esac
done

mpirun=${MPIRUN:-mpirun}
echo "mpirun.sh: $mpirun ${args[*]} $*" >&2
exec "$mpirun" "${args[@]}" "$@"
