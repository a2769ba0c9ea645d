#!/usr/bin/env bash
# A real one-node Slurm cluster for the tests: installs slurm-wlm/munge/PMIx if missing (root only), writes
# a private configuration under a temporary directory (nothing in /etc), starts munged, slurmctld and
# slurmd with the machine's real core count, runs the named checks, and stops what it started, also
# when a check fails or the run is interrupted. Usage (from a build tree or by hand):
#   tests/cluster/slurm_fixture.sh --build BUILD_DIR CHECK...     (checks listed in usage() below)
#   tests/cluster/slurm_fixture.sh --build build run srun -n 4 --mpi=pmix build/meshtrain version
# SPDX-License-Identifier: MIT
set -uo pipefail
# shellcheck disable=SC2034 # used by lib.sh
MT_FIXTURE=slurm
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
source "$HERE/lib.sh"

usage() {
    cat >&2 <<EOF
usage: $0 --build BUILD_DIR [--keep] [--np N] CHECK... | run CMD...
checks:
  srun_world    srun -n 4 --mpi=pmix of test_rt_world and mt_nodecheck (Slurm's ranks/local ranks/node = MPI's)
  srun_version  srun -n 4 --mpi=pmix meshtrain version
  sbatch        launch/slurm/train.sbatch submitted with sbatch completes; its output is checked
  scancel       a running train.sbatch job cancelled with scancel: every task gets SIGTERM and exits cleanly
  gres          --gpus-per-task=1 over fake GPUs (mknod): CUDA_VISIBLE_DEVICES/SLURM_STEP_GPUS per task
  topo          srun -n 4 meshtrain topo --json (tp=2, order=auto): 1 node, 4 local ranks, tp groups inside it
  sbatch_train ARGS...
                train.sbatch as users submit it (payload: meshtrain train ARGS) must complete with exit 0;
                paths in ARGS must be absolute (the job runs in the fixture's directory)
  run CMD...    any command inside the cluster (SLURM_CONF set); @MESHTRAIN@ and @BUILD@ are substituted
--np N: tasks per job (default 4, or MT_SLURM_NP); batch jobs run min(N, the node's CPUs).
--keep: keep the temporary directory with the daemons' logs and the jobs' output.
Environment: MT_CLUSTER_BUDGET (seconds for the whole run, default 150).
EOF
    exit 2
}

BUILD=
KEEP=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$(cd "$2" && pwd) || mt_fail "no build directory $2"; shift 2 ;;
    --keep) KEEP=1; shift ;; # keep the temporary directory (logs) after the run
    --np) MT_SLURM_NP=$2; shift 2 ;;
    -h | --help) usage ;;
    *) break ;;
    esac
done
[ -n "$BUILD" ] && [ $# -gt 0 ] || usage
MESHTRAIN=$BUILD/meshtrain
NODECHECK=$BUILD/tests/cluster/mt_nodecheck
RT_WORLD=$BUILD/tests/runtime/test_rt_world
NP=${MT_SLURM_NP:-4}
BUDGET=${MT_CLUSTER_BUDGET:-150}

# ---- packages -----------------------------------------------------------------------------------------
# slurm-wlm pulls slurmctld, slurmd, the client commands and slurm-wlm-basic-plugins (which holds mpi_pmix).
mt_need_packages slurm-wlm munge libpmix-dev
for b in slurmctld slurmd srun sbatch scancel scontrol sinfo munged mungekey ss; do
    command -v "$b" >/dev/null || mt_skip "$b not found in PATH although its package is installed"
done
PLUGINDIR=$(dirname "$(dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep '/mpi_pmix.so$' | head -1)")
[ -f "$PLUGINDIR/mpi_pmix.so" ] || mt_skip "Slurm's PMIx plugin (mpi_pmix.so) is not installed"

# ---- state and clean-up ----------------------------------------------------------------------------------
D=$(mktemp -d "${TMPDIR:-/tmp}/mt-slurm.XXXXXX")
chmod 755 "$D" # munged insists that every directory above its socket is searchable by all
export MT_CLUSTER_TAG=$D # in the environment of everything this run starts: found and reaped at the end
MUNGED_PID='' SLURMCTLD_PID='' SLURMD_PID=''
RC=0
CHECK_PID= # the running check: a background subshell, so that signals interrupt `wait` at once

cleanup() {
    local rc=$? leftover=0
    trap - EXIT INT TERM HUP
    [ $RC -ne 0 ] && rc=$RC
    mt_stop_check
    if [ -n "$SLURMCTLD_PID" ] && kill -0 "$SLURMCTLD_PID" 2>/dev/null; then
        timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null # our private cluster's jobs only
        local i
        for i in $(seq 1 50); do
            [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    mt_stop_pid "$SLURMD_PID" slurmd
    mt_stop_pid "$SLURMCTLD_PID" slurmctld
    mt_stop_pid "$MUNGED_PID" munged
    mt_stop_watchdog
    if ! mt_reap_tagged "$MT_CLUSTER_TAG"; then
        leftover=1
    fi
    if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
        mt_log "failed (exit $rc); daemon logs follow"
        for f in "$D"/log/*; do
            [ -s "$f" ] && { echo "---- $f (last 30 lines)" >&2; tail -30 "$f" >&2; }
        done
    fi
    if [ $leftover -ne 0 ]; then
        echo "FAIL: processes of this run outlived their daemons and jobs (listed above)" >&2
        [ $rc -eq 0 ] && rc=1
    fi
    if [ $KEEP -eq 1 ]; then
        mt_log "kept $D"
    else
        rm -rf "$D"
    fi
    exit $rc
}
mt_arm_fixture cleanup "$BUDGET"

# ---- configuration ---------------------------------------------------------------------------------------
mkdir -p "$D/etc" "$D/log" "$D/state" "$D/spool/mtnode0" "$D/out" "$D/dev"
mkdir -m 755 "$D/munge"
USER_NAME=$(id -un)
NODE=mtnode0
# The node's real hardware as slurmd sees it (CPUs, sockets, cores, threads, memory).
HW=$(slurmd -C 2>/dev/null | head -1 | sed -e 's/^NodeName=[^ ]* //')
echo "$HW" | grep -q 'CPUs=[0-9]' || mt_fail "slurmd -C did not describe this machine: '$HW'"
# Fake GPUs: Slurm's gres.conf accepts only character devices (NVIDIA's major 195). Where mknod is refused
# the gres check skips; everything else runs without GPUs.
GRES_NODE=
N_GPUS=4
if (for i in $(seq 0 $((N_GPUS - 1))); do mknod "$D/dev/nvidia$i" c 195 "$i" 2>/dev/null || exit 1; done); then
    GRES_NODE="Gres=gpu:$N_GPUS"
    cat >"$D/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu File=$D/dev/nvidia[0-$((N_GPUS - 1))]
EOF
else
    mt_log "mknod of character devices refused: no fake GPUs (the gres check will skip)"
fi
CTLD_PORT=$(mt_free_port)
SLURMD_PORT=$(mt_free_port)
while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(mt_free_port); done

cat >"$D/etc/slurm.conf" <<EOF
# Private one-node cluster written by tests/cluster/slurm_fixture.sh; lives and dies with $D.
ClusterName=mt$$
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
PluginDir=$PLUGINDIR
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/state/slurmctld.pid
SlurmdPidFile=$D/spool/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes tracked by /proc, CPU binding by sched_setaffinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SwitchType=switch/none
SchedulerType=sched/builtin
ReturnToService=2
InactiveLimit=0
# scancel: SIGTERM, then SIGKILL after KillWait seconds.
KillWait=10
MinJobAge=300
# Job ids of their own: Slurm's PMIx plugin and Open MPI name files after job ids, and another run of this
# fixture may be up at the same time.
FirstJobId=$((1000 + RANDOM * 10))
TmpFS=$D/tmp
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=20
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$(hostname) $HW $GRES_NODE State=UNKNOWN
PartitionName=mt Nodes=$NODE Default=YES MaxTime=10 State=UP
EOF
# Slurm's PMIx plugin keeps its client directories here instead of /tmp.
mkdir -p "$D/tmp" "$D/pmix"
echo "PMIxCliTmpDirBase=$D/pmix" >"$D/etc/mpi.conf"
export SLURM_CONF=$D/etc/slurm.conf

# ---- daemons ----------------------------------------------------------------------------------------------
# Each runs in the foreground (-F/-D) as a child of this script, so its PID is known; --pdeathsig ends it
# even if this script is killed with SIGKILL.
PDEATH=()
setpriv --help 2>/dev/null | grep -q pdeathsig && PDEATH=(setpriv --pdeathsig TERM --)
mungekey -c -k "$D/munge/munge.key" || mt_fail "mungekey failed"
"${PDEATH[@]}" munged -F --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" \
    >>"$D/log/munged.out" 2>&1 &
MUNGED_PID=$!
mt_wait_until 10 "munged's socket" test -S "$D/munge/munge.socket"
"${PDEATH[@]}" slurmctld -D -i -f "$SLURM_CONF" >>"$D/log/slurmctld.out" 2>&1 &
SLURMCTLD_PID=$!
"${PDEATH[@]}" slurmd -D -N "$NODE" -f "$SLURM_CONF" >>"$D/log/slurmd.out" 2>&1 &
SLURMD_PID=$!
node_idle() { timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | grep -qx idle; }
mt_wait_until 30 "node $NODE to become idle" node_idle
mt_log "cluster up in $SECONDS s: $HW ${GRES_NODE:-no GPUs}, ports $CTLD_PORT/$SLURMD_PORT, dir $D"

# Open MPI under srun: oversubscribed ranks must yield or they busy-poll the 2 cores of CI machines; the
# same for OpenMP's idle workers (as the rest of the test suite runs them).
export OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive

# ---- checks ------------------------------------------------------------------------------------------------
SRUN=(timeout -k 5 60 srun --mpi=pmix --overcommit --kill-on-bad-exit=1)

# job_state JOBID: prints the job's state (PENDING, RUNNING, COMPLETED, CANCELLED, ...).
job_state() { timeout 10 scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# wait_job SECONDS JOBID: waits for the job to end; on timeout shows why it has not (Reason=...).
wait_job() {
    local deadline=$((SECONDS + $1))
    until job_done "$2"; do
        if ((SECONDS >= deadline)); then
            echo "job $2 still not finished after $1 s:"
            timeout 10 scontrol show job "$2"
            return 1
        fi
        sleep 0.2
    done
}
job_done() { case $(job_state "$1") in COMPLETED | CANCELLED | FAILED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac; return 1; }

# Batch jobs: Slurm refuses --ntasks-per-node above the node's CPUs even with --overcommit (srun -n with
# --overcommit is fine), so batch jobs run min(NP, CPUs) tasks.
CPUS=$(echo "$HW" | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p')
BNP=$((NP < CPUS ? NP : CPUS))

# sbatch_train JOBNAME PAYLOAD: submits launch/slurm/train.sbatch with its payload replaced; prints the job id.
# The script asks for a real cluster's shape; the options here shrink it to this one node.
# An empty PAYLOAD keeps the script's own (meshtrain train); further arguments go to the script.
sbatch_train() {
    local name=$1 payload=$2 gpus=() env=(MESHTRAIN="$MESHTRAIN")
    shift 2
    [ -n "$GRES_NODE" ] && gpus=(--gpus-per-task=1)
    [ -n "$payload" ] && env+=(MT_TRAIN_CMD="$payload")
    env "${env[@]}" timeout 20 sbatch --parsable --job-name="$name" --nodes=1 --ntasks-per-node="$BNP" \
        --cpus-per-task=1 --overcommit --time=5 "${gpus[@]}" --output="$D/out/%x-%j.out" --chdir="$D/out" \
        "$SRC/launch/slurm/train.sbatch" "$@"
}

check_srun_world() {
    "${SRUN[@]}" -n "$NP" "$RT_WORLD" || return 1
    "${SRUN[@]}" -n "$NP" "$NODECHECK" --nodes 1 --local-size "$NP" --launcher slurm >"$D/out/nodecheck.out" ||
        { cat "$D/out/nodecheck.out"; return 1; }
    cat "$D/out/nodecheck.out"
    [ "$(grep -c '^nodecheck rank' "$D/out/nodecheck.out")" -eq "$NP" ] || { echo "expected $NP ranks to report"; return 1; }
}

check_srun_version() {
    "${SRUN[@]}" -n "$NP" "$MESHTRAIN" version >"$D/out/version.out" || { cat "$D/out/version.out"; return 1; }
    cat "$D/out/version.out"
    grep -q meshtrain "$D/out/version.out" || { echo "meshtrain version printed no version line"; return 1; }
}

check_sbatch() {
    local job out
    local gpu_check=''
    [ -n "$GRES_NODE" ] && gpu_check="--gpus-per-task 1"
    job=$(sbatch_train mt-train "$NODECHECK --nodes 1 --local-size $BNP --launcher slurm $gpu_check") || return 1
    mt_log "submitted train.sbatch as job $job"
    wait_job 60 "$job" || return 1
    out=$D/out/mt-train-$job.out
    cat "$out"
    [ "$(job_state "$job")" = COMPLETED ] || { echo "job $job ended $(job_state "$job"), expected COMPLETED"; return 1; }
    timeout 10 scontrol show job "$job" | grep -q 'ExitCode=0:0' || { echo "job $job: non-zero exit code"; return 1; }
    [ "$(grep -c '^nodecheck rank' "$out")" -eq "$BNP" ] || { echo "expected $BNP ranks in $out"; return 1; }
    grep -q "mt_nodecheck ($BNP ranks): [0-9]* checks, 0 failed" "$out" || { echo "node check failed in the job"; return 1; }
    grep -q "^train.sbatch: .*$BNP tasks" "$out" || { echo "train.sbatch did not report its launch line"; return 1; }
}

check_scancel() {
    local job out marks=$D/out/sig i
    mkdir -p "$marks"
    job=$(sbatch_train mt-cancel "$HERE/sigterm_task.sh $marks") || return 1
    mt_log "submitted job $job; waiting until its $BNP tasks run"
    started() { local f=("$marks"/start.*); [ -e "${f[0]}" ] && [ "${#f[@]}" -eq "$BNP" ]; }
    mt_wait_until 60 "$BNP tasks of job $job to start" started
    timeout 10 scancel "$job" || return 1
    wait_job 40 "$job" || return 1
    out=$D/out/mt-cancel-$job.out
    cat "$out"
    for f in "$marks"/*; do echo "$(basename "$f"): $(cat "$f")"; done
    [ "$(job_state "$job")" = CANCELLED ] || { echo "job $job ended $(job_state "$job"), expected CANCELLED"; return 1; }
    for i in $(seq 0 $((BNP - 1))); do
        grep -q "exited cleanly" "$marks/term.$i" 2>/dev/null || { echo "task $i did not handle SIGTERM"; return 1; }
    done
    if compgen -G "$marks/timeout.*" >/dev/null; then echo "a task was never signalled"; return 1; fi
    grep -q "train.sbatch: SIGTERM" "$out" || { echo "the batch script did not see SIGTERM"; return 1; }
}

check_topo() {
    "${SRUN[@]}" -n "$NP" --cpu-bind=none "$MESHTRAIN" topo --json --parallel.tp=2 --parallel.order=auto \
        >"$D/out/topo.json" || { cat "$D/out/topo.json"; return 1; }
    python3 "$HERE/check_topo_json.py" "$D/out/topo.json" --nodes 1 --ranks-per-node "$NP" --tp 2 --tp-in-node
}

check_sbatch_train() {
    local job out
    job=$(sbatch_train mt-train "" "$@") || return 1
    mt_log "submitted train.sbatch $* as job $job"
    wait_job 90 "$job" || return 1
    out=$D/out/mt-train-$job.out
    cat "$out"
    [ "$(job_state "$job")" = COMPLETED ] || { echo "job $job ended $(job_state "$job"), expected COMPLETED"; return 1; }
    grep -q "^train.sbatch: job step ended with exit code 0" "$out" || { echo "the job step failed"; return 1; }
    grep -q "^done: " "$out" || { echo "meshtrain train did not report that it finished"; return 1; }
}

check_gres() {
    [ -n "$GRES_NODE" ] || { echo "skipped: mknod of character devices is refused here, so Slurm has no GPUs to hand out"; return 77; }
    "${SRUN[@]}" -n "$NP" --gpus-per-task=1 "$NODECHECK" --launcher slurm --gpus-per-task 1 >"$D/out/gres.out" ||
        { cat "$D/out/gres.out"; return 1; }
    cat "$D/out/gres.out"
}

check_run() {
    local args=() a
    for a in "$@"; do
        a=${a//@MESHTRAIN@/$MESHTRAIN}
        args+=("${a//@BUILD@/$BUILD}")
    done
    timeout -k 5 90 "${args[@]}"
}

# ---- run the checks named on the command line -----------------------------------------------------------
mt_run_checks "run sbatch_train?" "$@"
