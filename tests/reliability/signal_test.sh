#!/usr/bin/env bash
# Sends SIGTERM mid-training to one rank (TARGET = rank) or to the launcher (TARGET = launcher) of a job
# running test_signals' mock loop, and checks the graceful stop: every rank exits 143 (128 + SIGTERM),
# every rank stops after the same step, the "checkpoint" of that step exists, all within SECONDS.
#   signal_test.sh TARGET NP SECONDS MPIEXEC [MPIEXEC_FLAGS...] -- test_signals
# SPDX-License-Identifier: MIT
set -u
target=$1 np=$2 limit=$3 mpiexec=$4
shift 4
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
exe=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
"$mpiexec" -n "$np" "${flags[@]}" "$exe" loop "$dir" >"$dir/out" 2>&1 &
launcher=$!
status=0
# Wait until every rank is past step 5.
for _ in $(seq 1 $((limit * 10))); do
    n=$(ls "$dir"/ready.* 2>/dev/null | wc -l)
    [ "$n" -eq "$np" ] && break
    sleep 0.1
done
if [ "$target" = launcher ]; then
    kill -TERM "$launcher"
else
    kill -TERM "$(cat "$dir/pid.$((np / 2))")"
fi
# Bounded wait for the launcher.
for _ in $(seq 1 $((limit * 10))); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
    echo "signal_test: TIMEOUT: the job did not stop within ${limit}s"; status=1
    kill -9 "$launcher"
    for f in "$dir"/pid.*; do kill -9 "$(cat "$f")" 2>/dev/null; done
fi
wait "$launcher"
rc=$?
cat "$dir/out"
for ((r = 0; r < np; r++)); do
    if ! grep -q "^rank $r: signal 15: stopping after step [0-9]* (checkpoint written), exit status 143" "$dir/out"; then
        echo "signal_test: rank $r did not stop cleanly on SIGTERM"; status=1
    fi
done
steps=$(grep -o "stopping after step [0-9]*" "$dir/out" | sort -u | wc -l)
if [ "$steps" -ne 1 ]; then
    echo "signal_test: ranks stopped after different steps"; status=1
fi
step=$(grep -o "stopping after step [0-9]*" "$dir/out" | head -1 | awk '{print $4}')
if [ "$(cat "$dir/ckpt" 2>/dev/null)" != "step $step" ]; then
    echo "signal_test: checkpoint missing or not of step $step: $(cat "$dir/ckpt" 2>/dev/null)"; status=1
fi
if [ "$rc" -eq 0 ]; then
    echo "signal_test: the launcher exited 0; a stopped job must not look finished"; status=1
fi
echo "signal_test: SIGTERM to $target, launcher exit $rc, $(( $(date +%s) - start ))s: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
