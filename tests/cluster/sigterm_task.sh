#!/usr/bin/env bash
# Stand-in training task for the scancel check: records that it started, then waits (at most 60 s); on
# SIGTERM it records the signal and exits 0, the way a training job that checkpoints on SIGTERM does.
# Usage: sigterm_task.sh MARKER_DIR   (one file per task and event, named by the task's rank)
# SPDX-License-Identifier: MIT
dir=$1
id=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-0}}
trap 'echo "rank $id pid $$ got SIGTERM and exited cleanly" >"$dir/term.$id"; exit 0' TERM
echo "rank $id pid $$ started on $(hostname)" >"$dir/start.$id"
for ((i = 0; i < 600; i++)); do
    sleep 0.1
done
echo "rank $id was never signalled" >"$dir/timeout.$id"
exit 3
