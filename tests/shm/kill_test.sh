#!/bin/bash
# A rank killed (kill -9) in the middle of shared-memory all-reduces: the survivors must exit with an
# error naming the op and call instead of hanging, and no segment of the job may be left in /dev/shm.
# Usage: kill_test.sh METHOD(memfd|posix) NP VICTIM MPIEXEC [mpiexec flags...] -- EXE
# SPDX-License-Identifier: MIT
set -u
method=$1 np=$2 victim=$3 mpiexec=$4
shift 4
flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
shift
exe=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "--- job output:"; cat "$dir/out"; exit 1; }

# --enable-recovery: Open MPI keeps the survivors running after a rank dies, so they must notice by
# themselves (otherwise mpirun kills them and the test would prove nothing about our detection).
MESHTRAIN_SHM_METHOD=$method MESHTRAIN_COLL_TIMEOUT=30 MESHTRAIN_SHM_TIMEOUT=30 MESHTRAIN_SHM_MIN_BYTES=0 \
    timeout -s KILL 100 "$mpiexec" -np "$np" "${flags[@]}" --enable-recovery "$exe" "$dir/pids" > "$dir/out" 2>&1 &
job=$!
for _ in $(seq 1 600); do
    [ -s "$dir/pids" ] && break
    kill -0 $job 2>/dev/null || fail "job ended before its first all-reduce"
    sleep 0.1
done
[ -s "$dir/pids" ] || fail "no pid file after 60 s"
mapfile -t pids < "$dir/pids"
[ "${#pids[@]}" -eq "$np" ] || fail "pid file lists ${#pids[@]} ranks, want $np"
# While running: no name of this job's segment exists (posix names carry local rank 0's pid)
named=$(ls /dev/shm 2>/dev/null | grep -c "^mt-shm-${pids[0]}-")
[ "$named" -eq 0 ] || fail "$named named segment(s) in /dev/shm while the job runs"
if [ "$method" = memfd ]; then
    grep -q "/memfd:mt-shm-killtest (deleted)" "/proc/${pids[1]}/maps" || fail "rank 1 maps no memfd segment"
fi
sleep 0.3
kill -9 "${pids[$victim]}"
t0=$(date +%s)
wait $job
rc=$?
t1=$(date +%s)
echo "job exit code $rc after $((t1 - t0)) s"
[ $rc -ne 137 ] || fail "the job hung (killed by the 100 s guard)"
# (with --enable-recovery mpirun's own exit code does not reflect the survivors' exit codes: each
# survivor prints its error and exits 3, which the lines below check)
n=$(grep -c "^survivor rank" "$dir/out")
[ "$n" -eq $((np - 1)) ] || fail "$n survivors reported an error, want $((np - 1))"
grep -q "shm all_reduce (call [0-9]*," "$dir/out" || fail "no error names the op and call number"
grep -q "local rank $victim (comm rank $victim, pid ${pids[$victim]}) has died" "$dir/out" || \
    grep -q "failed (see its own error)" "$dir/out" || fail "no error names the dead rank"
left=$(ls /dev/shm 2>/dev/null | grep -c "^mt-shm-${pids[0]}-")
[ "$left" -eq 0 ] || fail "$left segment(s) of the job left in /dev/shm"
grep "^survivor rank" "$dir/out"
echo "PASS: kill -9 of rank $victim ($method): survivors failed cleanly, nothing left in /dev/shm"
