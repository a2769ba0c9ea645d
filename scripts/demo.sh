#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the default training job
# (launch/configs/demo.toml, embedded in the binary: a small GPT-2, tensor parallel 2 x data parallel 2)
# on 4 ranks of this machine, then draws its metrics and says where everything is.
# SPDX-License-Identifier: MIT
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$MT_ROOT"
np=${MT_DEMO_RANKS:-4}
out=out/demo
echo "meshtrain: running the default job on $np ranks: mpirun -np $np build/meshtrain train"
# setup.sh exported what Open MPI needs here (root, more ranks than cores, yield when idle).
mpirun -np "$np" --oversubscribe --bind-to none build/meshtrain train "$@"
if [ -s "$out/metrics.jsonl" ]; then
    launch/plot-metrics "$out/metrics.jsonl" "$out/metrics.png" "meshtrain default job: GPT-2, tp 2 x dp 2"
fi
echo
echo "meshtrain: the default job's outputs, in $MT_ROOT/$out:"
for f in metrics.jsonl metrics.png trace.json memory.rank0.json ckpt/latest; do
    [ -e "$out/$f" ] && printf '  %-20s %s\n' "$f" "$(case $f in
        metrics.jsonl) echo "one JSON object per step (docs/metrics.md)";;
        metrics.png) echo "loss, tokens/s and memory over the steps";;
        trace.json) echo "timeline of steps 20-22 on every rank: open in https://ui.perfetto.dev";;
        memory.rank0.json) echo "allocator history of those steps (one file per rank)";;
        ckpt/latest) echo "newest checkpoint: $(cat "$out/ckpt/latest") (docs/checkpoints.md)";;
    esac)"
done
