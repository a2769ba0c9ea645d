#!/usr/bin/env bash
# launch/plot-metrics on the metrics of a short run writes a PNG; a missing input is refused (status 2).
#   plot_check.sh MESHTRAIN PLOT_METRICS
# SPDX-License-Identifier: MIT
set -eu
bin=$1 plot=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" train --parallel.tp=1 --train.steps=4 --train.eval_every=2 --metrics.jsonl="$dir/m.jsonl" --checkpoint.dir= \
    --profile.trace= --profile.memory= >/dev/null
"$plot" "$dir/m.jsonl" "$dir/m.png"
[ "$(head -c 8 "$dir/m.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "plot_check: not a PNG"; exit 1; }
[ "$(stat -c %s "$dir/m.png")" -gt 5000 ] || { echo "plot_check: PNG too small to hold three panels"; exit 1; }
set +e
"$plot" "$dir/missing.jsonl" "$dir/x.png" 2>"$dir/err"
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "cannot read" "$dir/err" || { cat "$dir/err"; echo "plot_check: missing input not refused"; exit 1; }
echo "plot_check: ok"
