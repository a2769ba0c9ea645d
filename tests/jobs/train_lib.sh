# shellcheck shell=bash
# Shared by the test scripts that run `meshtrain train` (tests/jobs, tests/parallel3d, tests/reliability):
# the command-line arguments, a scratch directory and one training run. Sourced, not run.
# SPDX-License-Identifier: MIT

# train_setup TAG MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]: sets tag (the prefix of every message), bin,
# mpiexec, flags and dir (a temporary directory removed on exit).
train_setup() {
    tag=$1 bin=$2 mpiexec=$3
    shift 3
    flags=("$@")
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
}

# run NAME NP ARGS...: `meshtrain train` with the caller's ${common[@]} and ARGS on NP ranks (1: no
# mpiexec), metrics to $dir/NAME.jsonl, output to $dir/NAME.out (printed, and the script exits 1, on failure).
run() {
    local name=$1 np=$2
    shift 2
    local cmd=("$bin" train "${common[@]}" --metrics.jsonl="$dir/$name.jsonl" "$@")
    if [ "$np" -gt 1 ]; then
        cmd=("$mpiexec" -n "$np" "${flags[@]}" "${cmd[@]}")
    fi
    if ! "${cmd[@]}" >"$dir/$name.out" 2>&1; then
        cat "$dir/$name.out"
        echo "$tag: run $name failed"
        exit 1
    fi
}
