#!/usr/bin/env bash
# checkpoint.on_signal: SIGTERM in the middle of a long job writes a checkpoint after the current step and
# exits with status 1 saying where it is; the checkpoint is complete (export reads it) and `latest` names it.
#   ckpt_signal.sh MESHTRAIN
# SPDX-License-Identifier: MIT
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" train --parallel.tp=1 --train.steps=100000 --train.log_every=1000 --checkpoint.dir="$dir/ck" --profile.trace= --profile.memory= \
    --checkpoint.every=0 --metrics.jsonl="$dir/m.jsonl" >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
    [ -s "$dir/m.jsonl" ] && [ "$(wc -l <"$dir/m.jsonl")" -ge 3 ] && break
    sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
rc=$?
cat "$dir/out" | grep -v " = " | tail -5
[ "$rc" -eq 1 ] || { echo "ckpt_signal: expected exit status 1, got $rc"; exit 1; }
grep -qE "stopped by SIGTERM after step [0-9]+; checkpoint $dir/ck/step-[0-9]+ written" "$dir/out" \
    || { echo "ckpt_signal: no stop message"; exit 1; }
step=$(grep -oE "stopped by SIGTERM after step [0-9]+" "$dir/out" | grep -oE "[0-9]+$")
[ "$(cat "$dir/ck/latest")" = "$(printf 'step-%08d' "$step")" ] || { echo "ckpt_signal: latest is not step $step"; exit 1; }
"$bin" export --llmc "$dir/w.bin" "$dir/ck" >/dev/null || { echo "ckpt_signal: the checkpoint does not load"; exit 1; }
echo "ckpt_signal: ok (stopped after step $step)"
