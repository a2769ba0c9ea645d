#!/usr/bin/env bash
# Runs a command on NP ranks (NP 0 = no launcher) and checks that EVERY rank exits with the expected
# status, that the output matches a regular expression, and that the whole run ends within a time
# limit (no rank hangs).
#   expect_exit.sh NP EXPECTED_RC REGEX SECONDS MPIEXEC [MPIEXEC_FLAGS...] -- command args...
# SPDX-License-Identifier: MIT
set -u
np=$1 want=$2 regex=$3 limit=$4 mpiexec=$5
shift 5
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
if [ "$np" -eq 0 ]; then
    timeout "$limit" "$@" >"$dir/out" 2>&1
    echo $? >"$dir/rc.0"
    np=1
else
    # Each rank records its own exit status; the rank id comes from whichever launcher started it.
    timeout "$limit" "$mpiexec" -n "$np" "${flags[@]}" sh -c '"$@"; echo $? > "'"$dir"'/rc.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}"' sh "$@" \
        >"$dir/out" 2>&1
fi
rc_launcher=$?
elapsed=$(( $(date +%s) - start ))
cat "$dir/out"
status=0
if [ "$rc_launcher" -eq 124 ]; then
    echo "expect_exit: TIMEOUT after ${limit}s: a rank hung"; status=1
fi
for ((r = 0; r < np; r++)); do
    got=$(cat "$dir/rc.$r" 2>/dev/null || echo missing)
    if [ "$got" != "$want" ]; then
        echo "expect_exit: rank $r exited with $got, expected $want"; status=1
    fi
done
if ! grep -Eq -- "$regex" "$dir/out"; then
    echo "expect_exit: output does not match /$regex/"; status=1
fi
echo "expect_exit: $np rank(s), exit $want expected, ${elapsed}s: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
