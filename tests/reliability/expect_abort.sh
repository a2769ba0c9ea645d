#!/usr/bin/env bash
# Runs a command on NP ranks and checks that the job FAILS the way a reliability scenario must: the
# launcher exits non-zero, within SECONDS (no hang), no rank reports success (each rank's own status is
# recorded when it exits by itself; a rank the launcher killed has none, which counts as a failure
# exit), the output matches every -e REGEX, and no rank process is left behind.
#   expect_abort.sh NP SECONDS [-e REGEX]... [-L] -- MPIEXEC [MPIEXEC_FLAGS...] -- command args...
# -L: do not require a non-zero launcher status (Open MPI's --enable-recovery exits 0 whatever the ranks do).
# -f FILE REGEX: FILE must exist afterwards and match REGEX (it is removed first).
# SPDX-License-Identifier: MIT
set -u
np=$1 limit=$2
shift 2
regexes=()
files=()
file_res=()
check_launcher=1
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [ "$1" = "-e" ] && { regexes+=("$2"); shift 2; continue; }
    [ "$1" = "-L" ] && { check_launcher=0; shift; continue; }
    [ "$1" = "-f" ] && { files+=("$2"); file_res+=("$3"); rm -f "$2"; shift 3; continue; }
    echo "expect_abort: unexpected argument $1"; exit 2
done
shift
mpiexec=$1
shift
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s%N)
# A session of its own, so that whatever survives the launcher can be found (and is a failure).
setsid bash -c 'echo $$ > "$0/sid"; exec timeout "$@"' "$dir" "$limit" "$mpiexec" -n "$np" "${flags[@]}" \
    sh -c '"$@"; rc=$?; echo $rc > "'"$dir"'/rc.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}"; exit $rc' \
    sh "$@" >"$dir/out" 2>&1
rc=$?
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$dir/out"
status=0
if [ "$rc" -eq 124 ]; then
    echo "expect_abort: TIMEOUT after ${limit}s: the job hung"; status=1
elif [ "$rc" -eq 0 ] && [ $check_launcher -eq 1 ]; then
    echo "expect_abort: the launcher exited 0, expected a failure"; status=1
fi
for ((r = 0; r < np; r++)); do
    if [ -f "$dir/rc.$r" ] && [ "$(cat "$dir/rc.$r")" = "0" ]; then
        echo "expect_abort: rank $r exited 0"; status=1
    fi
done
for re in "${regexes[@]}"; do
    if ! grep -Eq -- "$re" "$dir/out"; then
        echo "expect_abort: output does not match /$re/"; status=1
    fi
done
for i in "${!files[@]}"; do
    if ! grep -Eq -- "${file_res[$i]}" "${files[$i]}" 2>/dev/null; then
        echo "expect_abort: ${files[$i]} missing or does not match /${file_res[$i]}/"; status=1
    fi
    rm -f "${files[$i]}"
done
# Live (non-zombie) processes of the session; the launcher's last kills may need a moment to land.
alive() { ps -o pid=,stat= -s "$(cat "$dir/sid")" | awk '$2 !~ /^Z/ {print $1}'; }
for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=$(alive)
    [ -z "$left" ] && break
    sleep 0.3
done
if [ -n "$left" ]; then
    echo "expect_abort: processes left behind: $(echo $left)"; status=1
    kill -9 $left 2>/dev/null
fi
echo "expect_abort: $np rank(s), launcher exit $rc, ${elapsed} ms: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
