#!/usr/bin/env bash
# `meshtrain plan --check` against a real run: train the tiny job on NP ranks (0: no launcher) with the
# given overrides, writing metrics.jsonl, then check the plan's memory for that layout is within 10% of
# the allocator's peak the run reports. The cluster is given this machine's CPUs (cluster.cores_per_node =
# nproc): the run binds each rank to its share of them, which sizes the shared-memory collectives' segments.
#   check_run.sh MESHTRAIN JOB CLUSTER NP MPIEXEC [MPIEXEC_FLAGS...] -- OVERRIDES...
# SPDX-License-Identifier: MIT
set -euo pipefail
bin=$1 job=$2 cluster=$3 np=$4 mpiexec=$5
shift 5
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
world=$np
sed "s/^\[cluster\]\$/[cluster]\ncores_per_node = $(nproc)/" "$cluster" > "$dir/cluster.toml"
cluster=$dir/cluster.toml
if [ "$np" -eq 0 ]; then
    world=1
    "$bin" train "$job" --train.steps=4 --metrics.jsonl="$dir/m.jsonl" "$@" > "$dir/train.txt" 2>&1 || { cat "$dir/train.txt"; exit 1; }
else
    "$mpiexec" -n "$np" "${flags[@]}" "$bin" train "$job" --train.steps=4 --metrics.jsonl="$dir/m.jsonl" "$@" \
        > "$dir/train.txt" 2>&1 || { cat "$dir/train.txt"; exit 1; }
fi
"$bin" plan "$job" --cluster "$cluster" --world "$world" "$@" --check "$dir/m.jsonl"
out=$("$bin" plan "$job" --cluster "$cluster" --world "$world" "$@" --check "$dir/m.jsonl" --json)
err=$(printf '%s' "$out" | sed -n 's/.*"mem_error": \([-0-9.e]*\).*/\1/p')
if awk -v e="$err" 'BEGIN { exit !(e > -0.10 && e < 0.10) }'; then
    echo "check_run: planned memory within 10% of the run's peak (error $err)"
else
    echo "check_run: planned memory error $err is outside 10%"; exit 1
fi
