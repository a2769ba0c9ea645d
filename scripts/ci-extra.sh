#!/usr/bin/env bash
# CI hook for reliability (issue 10; the lead decides how .ci/run calls it):
#   sanitize  the whole ctest suite built with ASan + UBSan (-DMESHTRAIN_SANITIZE=ON, CPU-only) in
#             build-asan/; any sanitizer report fails its test (UBSan does not recover; LeakSanitizer runs
#             at exit with only Open MPI's own allocations suppressed, tests/lsan.supp).
#   fuzz      each libFuzzer harness (clang, -DMESHTRAIN_FUZZ=ON, build-fuzz/) for MT_FUZZ_SECONDS
#             (default 40) from the inputs in tests/data/fuzz-regressions/<target>/; a crash fails the run
#             and its input is left in build-fuzz/crashes/: fix the bug, then add the input to
#             tests/data/fuzz-regressions/<target>/ so every build replays it.
# Usage: scripts/ci-extra.sh [sanitize|fuzz|all]   (default all; about 10 minutes on 2 cores)
# SPDX-License-Identifier: MIT
set -euo pipefail
what=${1:-all}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${MT_CI_EXTRA_JOBS:-2}
t0=$(date +%s)
status=0

if [ "$what" = all ] || [ "$what" = sanitize ]; then
    echo "ci-extra: sanitizer build and suite (build-asan/)"
    (
        export MT_BUILD=$root/build-asan MT_WERROR=ON MT_CMAKE_ARGS="-DMESHTRAIN_SANITIZE=ON -DMT_CUDA=OFF"
        source "$root/scripts/setup.sh"
        cd "$MT_BUILD"
        ctest --output-on-failure -j "$jobs"
    ) || status=1
    echo "ci-extra: sanitizer suite $([ $status -eq 0 ] && echo passed || echo FAILED) after $(( $(date +%s) - t0 ))s"
fi

if [ "$what" = all ] || [ "$what" = fuzz ]; then
    secs=${MT_FUZZ_SECONDS:-40}
    missing=()
    for p in clang libclang-rt-14-dev libomp-dev cmake ninja-build libopenmpi-dev libhwloc-dev libopenblas-dev; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "ci-extra: fuzzing needs: apt-get install ${missing[*]}" >&2
            exit 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    fb=$root/build-fuzz
    CC=clang CXX=clang++ cmake -S "$root" -B "$fb" -G Ninja -DMESHTRAIN_FUZZ=ON -DMT_CUDA=OFF >/dev/null
    # One fuzzer per directory of regression inputs whose harness this tree builds (fuzz_ckpt needs the
    # training-job code).
    targets=()
    for d in "$root"/tests/data/fuzz-regressions/*/; do
        t=$(basename "$d")
        ninja -C "$fb" -t query "fuzz_$t" >/dev/null 2>&1 && targets+=("$t")
    done
    cmake --build "$fb" -j "$jobs" --target "${targets[@]/#/fuzz_}"
    mkdir -p "$fb/crashes"
    for t in "${targets[@]}"; do
        corpus=$fb/corpus/$t
        mkdir -p "$corpus"
        cp "$root/tests/data/fuzz-regressions/$t/"* "$corpus/"
        echo "ci-extra: fuzz_$t for ${secs}s"
        if ! "$fb/tests/fuzz/fuzz_$t" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
                -print_final_stats=1 -artifact_prefix="$fb/crashes/$t-" "$corpus" >"$fb/fuzz_$t.log" 2>&1; then
            status=1
            grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$fb/fuzz_$t.log" || tail -n 30 "$fb/fuzz_$t.log"
            echo "ci-extra: fuzz_$t FOUND A CRASH (input in $fb/crashes/)"
        else
            grep -E "stat::number_of_executed_units|stat::new_units_added" "$fb/fuzz_$t.log" | tr '\n' ' '
            echo
        fi
    done
fi
echo "ci-extra: $what $([ $status -eq 0 ] && echo passed || echo FAILED) in $(( $(date +%s) - t0 ))s"
exit $status
