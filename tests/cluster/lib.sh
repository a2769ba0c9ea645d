# shellcheck shell=bash
# Shared by the cluster fixtures (slurm_fixture.sh, netns_fixture.sh): messages, skip/fail exits, bounded
# waits, a watchdog that ends the whole fixture run, packages, the search for processes a run left, and
# the traps and the loop that run the checks named on the command line.
# Sourced, not run. Every wait here has a limit; nothing waits forever.
# SPDX-License-Identifier: MIT

MT_FIXTURE=${MT_FIXTURE:-cluster} # name in messages; set by the fixture before sourcing

mt_log() { echo "[$MT_FIXTURE $(date +%T)] $*" >&2; }

# Exit 77 (ctest SKIP_RETURN_CODE) with the reason on stdout, where ctest's log shows it.
mt_skip() {
    echo "skipped: $*"
    exit 77
}

mt_fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# mt_wait_until SECONDS WHAT CMD...: runs CMD every 0.2 s until it succeeds; fails naming WHAT after SECONDS.
mt_wait_until() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            mt_fail "timed out after ${limit}s waiting for $what"
        fi
        sleep 0.2
    done
}

# mt_watchdog SECONDS: sends SIGTERM to this script after SECONDS so its EXIT trap cleans up even if a
# step hangs past its own limit. The watchdog's PID is in MT_WATCHDOG_PID (killed by mt_stop_watchdog).
mt_watchdog() {
    local me=$$
    (
        trap 'kill -TERM $sleeper 2>/dev/null; exit 0' TERM
        sleep "$1" &
        sleeper=$!
        wait $sleeper
        echo "[$MT_FIXTURE] watchdog: run exceeded $1 s, terminating it" >&2
        kill -TERM "$me" 2>/dev/null
    ) &
    MT_WATCHDOG_PID=$!
}

mt_stop_watchdog() {
    if [ -n "${MT_WATCHDOG_PID:-}" ]; then
        kill -TERM "$MT_WATCHDOG_PID" 2>/dev/null # its trap ends its sleep too
        wait "$MT_WATCHDOG_PID" 2>/dev/null
        MT_WATCHDOG_PID=
    fi
}

# mt_need_packages PKG...: installs missing Debian packages as root; otherwise prints the exact command and
# skips (exit 77), since only an administrator can provide them.
mt_need_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null; then
        mt_skip "needs ${missing[*]} and this is not a Debian/Ubuntu machine (no apt-get); install them by hand"
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "run as root: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
        mt_skip "missing packages ${missing[*]} and not root (see the line above)"
    fi
    mt_log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Bounded: 60 s for another apt/dpkg to release its lock, 120 s per step.
    local apt=(apt-get -o DPkg::Lock::Timeout=60 -y -qq)
    timeout 120 "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null ||
        { timeout 120 "${apt[@]}" update && timeout 120 "${apt[@]}" install --no-install-recommends "${missing[@]}" \
            >/dev/null; } || mt_fail "apt-get install ${missing[*]} failed (see above)"
}

# mt_free_port: prints a TCP port no socket uses (another fixture run may be active on this machine).
# Ports come from below the kernel's ephemeral range, which outgoing connections (MPI's TCP wire-up, other
# tests) take their local ports from: a port picked there can be taken between the check and the daemon's
# bind ("Address already in use"). The check covers sockets in any state, not only listening ones.
mt_free_port() {
    local port _ lo hi
    read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
    hi=$((lo > 12000 ? lo - 1 : 32767))
    for _ in $(seq 1 50); do
        port=$((10000 + RANDOM % (hi - 10000)))
        if ! ss -Htan "sport = :$port" 2>/dev/null | grep -q .; then
            echo "$port"
            return 0
        fi
    done
    mt_fail "no free TCP port found"
}

# mt_tagged_pids TAG: PIDs of processes (other than this shell) whose environment holds MT_CLUSTER_TAG=TAG,
# i.e. everything this fixture run started, directly or through a daemon or a job.
mt_tagged_pids() {
    local tag=$1 p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = "$$" ] && continue
        [ "$p" = "$BASHPID" ] && continue
        if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "MT_CLUSTER_TAG=$tag"; then
            echo "$p"
        fi
    done
}

# mt_reap_tagged TAG: TERM, then (after up to 5 s) KILL whatever of this run is still alive. Returns 1 and
# lists the processes if any had to be killed this way.
mt_reap_tagged() {
    local tag=$1 pids _
    pids=$(mt_tagged_pids "$tag")
    [ -z "$pids" ] && return 0
    mt_log "processes of this run still alive: $(echo $pids)"
    ps -o pid,ppid,args -p "$(echo $pids | tr ' ' ',')" >&2 2>/dev/null || true
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 1 25); do
        pids=$(mt_tagged_pids "$tag")
        [ -z "$pids" ] && break
        sleep 0.2
    done
    pids=$(mt_tagged_pids "$tag")
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    return 1
}

# mt_stop_pid PID NAME: SIGTERM, wait up to 10 s, then SIGKILL. For daemons this run started.
mt_stop_pid() {
    local pid=$1 name=$2 _
    [ -z "$pid" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        mt_log "$name (pid $pid) ignored SIGTERM for 10 s; killing it"
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    return 0
}

# mt_arm_fixture CLEANUP SECONDS: CLEANUP runs on exit; SIGINT/SIGHUP/SIGTERM set RC (130/143) and exit
# through it; the watchdog ends the run after SECONDS.
mt_arm_fixture() {
    # shellcheck disable=SC2064 # the handler's name is meant to be expanded now
    trap "$1" EXIT
    trap 'mt_log "interrupted"; RC=130; exit 130' INT HUP
    trap 'mt_log "terminated"; RC=143; exit 143' TERM
    mt_watchdog "$2"
}

# mt_stop_check: for the fixtures' clean-up: ends the running check (CHECK_PID) and the command it runs
# (srun, mpirun, timeout), which ends its step or job.
mt_stop_check() {
    if [ -n "${CHECK_PID:-}" ] && kill -0 "$CHECK_PID" 2>/dev/null; then
        pkill -TERM -P "$CHECK_PID" 2>/dev/null
        kill -TERM "$CHECK_PID" 2>/dev/null
    fi
}

# mt_run_checks GREEDY CHECK...: runs each named check as the fixture's function check_NAME in a background
# subshell (CHECK_PID: a signal interrupts `wait` at once and mt_stop_check can end it). GREEDY lists the
# checks that take all the arguments after them (space-separated; a trailing '?' allows none, otherwise
# none is a usage error). An unknown name is a usage error (the fixture's usage(), exit 2). A check that
# fails sets RC=1 and exits 1 at once; one that exits 77 (skipped) sets RC=77 and the others still run.
# Exits with RC when all have run.
mt_run_checks() {
    local greedy=" $1 " name rc
    shift
    while [ $# -gt 0 ]; do
        name=$1
        shift
        if [[ $greedy == *" $name "* || $greedy == *" $name? "* ]]; then
            [[ $greedy == *" $name? "* ]] || [ $# -gt 0 ] || usage
            mt_log "check $name: $*"
            "check_$name" "$@" &
            CHECK_PID=$!
            wait $CHECK_PID
            rc=$?
            set --
        else
            declare -F "check_$name" >/dev/null || { echo "unknown check '$name'" >&2; usage; }
            mt_log "check $name"
            "check_$name" &
            CHECK_PID=$!
            wait $CHECK_PID
            rc=$?
        fi
        if [ $rc -eq 77 ]; then
            RC=77
        elif [ $rc -ne 0 ]; then
            RC=1
            mt_log "check $name FAILED (exit $rc)"
            exit 1
        else
            mt_log "check $name passed"
        fi
    done
    exit "$RC"
}
