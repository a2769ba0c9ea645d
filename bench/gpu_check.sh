#!/usr/bin/env bash
# One-shot check of meshtrain's GPU path on one H100/H200, in under 8 minutes: builds for sm_90, runs the
# GPU tests, measures the dense matrix peak, GPT-2 124M training throughput and MFU in fp32/tf32/bf16/fp16
# (gpu_bench's loop, and `meshtrain train --runtime.device=cuda` in bf16), the attention kernels against the
# plain version, the NCCL collective benchmark on the GPU and peak device memory, then prints a short table; on
# a machine with 2 or more GPUs also `meshtrain train` on 2 of them with dp 2, tp 2 and tp 2 + sequence
# parallelism (each with the tp collectives unchunked and in 4 chunks, parallel.tp_comm_chunks) and pp 2,
# against one GPU. Full logs go to the directory given as the argument.
#   usage: bench/gpu_check.sh LOGDIR
#   environment: MT_GPU_CHECK_BUILD (build directory, default build-gpu-check), MT_GPU_CHECK_B (micro-batch,
#   default 16), MT_GPU_CHECK_STEPS (timed steps per mode, default 10), MT_GPU_CHECK_EXTRA_B (more bf16
#   micro-batches, e.g. "32 64"), MT_GPU_CHECK_SANITIZE=1 (compute-sanitizer memcheck/racecheck over the
#   kernel tests; a report fails the verdict), MT_DEPS_PREFIX (a prefix holding
#   MPI, hwloc and OpenBLAS when the machine lacks them; see docs/gpu.md), MT_GPU_CHECK_PREBUILT=1 (use the
#   build bench/gpu_pack.sh made on another machine; no compiler needed), MT_GPU_DEPS (its mtdeps.tar.xz)
# SPDX-License-Identifier: MIT
set -u
if [ $# -ne 1 ]; then
    echo "usage: $0 LOGDIR" >&2
    exit 2
fi
LOG=$1
mkdir -p "$LOG" || exit 2
LOG=$(cd "$LOG" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MT_GPU_CHECK_BUILD:-$SRC/build-gpu-check}
B=${MT_GPU_CHECK_B:-16}
STEPS=${MT_GPU_CHECK_STEPS:-10}
START=$(date +%s)
BUDGET=470 # seconds: the whole script stays under 8 minutes
JOBS=$(nproc 2>/dev/null || echo 4)

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[gpu_check $(($(date +%s) - START))s] $*" | tee -a "$LOG/summary.log"; }
# run NAME SECONDS CMD...: runs CMD with a time limit bounded by what is left, output to LOG/NAME.log
run() {
    local name=$1 limit=$2
    shift 2
    local l
    l=$(left)
    if [ "$l" -lt 10 ]; then
        say "$name: skipped, the 8-minute budget is spent"
        return 124
    fi
    [ "$limit" -gt "$l" ] && limit=$l
    timeout --signal=TERM --kill-after=5 "$limit" "$@" >"$LOG/$name.log" 2>&1
    local rc=$?
    say "$name: exit $rc ($LOG/$name.log)"
    return $rc
}

: >"$LOG/summary.log"
say "source $SRC, build $BUILD, logs $LOG"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$LOG/nvidia-smi-L.log" 2>&1; then
    say "no GPU visible (nvidia-smi -L failed): nothing to check"
    exit 1
fi
nvidia-smi -q >"$LOG/nvidia-smi-q.log" 2>&1
say "device: $(head -1 "$LOG/nvidia-smi-L.log")"

# ---- build (sm_90 only: the checked chip; Release), or the build bench/gpu_pack.sh made elsewhere ---------
TARGETS=(test_cuda_alloc test_gpu_ops test_cuda_alloc_device test_nvml test_gpt2_cuda test_job_cuda test_tensor_cuda test_device_cuda gpu_bench meshtrain)
if [ -n "${MT_GPU_CHECK_PREBUILT:-}" ]; then
    # the packed run-time libraries (Open MPI relocated, hwloc, OpenBLAS...), when given
    if [ -n "${MT_GPU_DEPS:-}" ]; then
        DEPS_DIR=$(mktemp -d /tmp/mtdeps.XXXXXX)
        if ! tar -C "$DEPS_DIR" -xJf "$MT_GPU_DEPS"; then
            say "cannot unpack MT_GPU_DEPS=$MT_GPU_DEPS (made by bench/gpu_pack.sh)"
            exit 1
        fi
        # shellcheck disable=SC1091
        source "$DEPS_DIR/mtdeps/env.sh"
        say "packed run-time libraries from $MT_GPU_DEPS in $DEPS_DIR/mtdeps"
    fi
    # the CUDA libraries the build links but the pack leaves out (cuBLAS, cuBLASLt, NCCL): the GPU machine's own,
    # wherever its CUDA toolkit or its Python packages keep them
    missing() { ldd "$BUILD/meshtrain" "$BUILD/bench/gpu_bench" 2>&1 | awk '/not found/ { print $1 }' | sort -u; }
    for lib in $(missing); do
        found=$(find /usr/local/cuda*/ /usr/lib /opt -name "$lib" \( -type f -o -type l \) 2>/dev/null | head -1)
        if [ -n "$found" ]; then
            LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
            export LD_LIBRARY_PATH
            say "$lib: using $found"
        fi
    done
    MISSING=$(missing | tr '\n' ' ')
    if [ -n "$MISSING" ] || [ ! -x "$BUILD/meshtrain" ]; then
        say "prebuilt binaries in $BUILD cannot run here: missing ${MISSING:-the binaries (run bench/gpu_pack.sh)}"
        exit 1
    fi
    # multi-rank tests name the mpiexec of the machine that built them: use the packed one where that is absent
    MPIEXEC_BUILT=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
    if [ -n "${MT_PACKED_MPIEXEC:-}" ] && [ -n "$MPIEXEC_BUILT" ] && [ ! -x "$MPIEXEC_BUILT" ]; then
        # from a kept copy of each file as the build wrote it, so that a later run with another unpack directory
        # rewrites the original path again
        find "$BUILD" -name CTestTestfile.cmake | while read -r f; do
            [ -f "$f.built" ] || cp "$f" "$f.built"
            sed "s#\"$MPIEXEC_BUILT\"#\"$MT_PACKED_MPIEXEC\"#g" "$f.built" >"$f"
        done
        say "multi-rank tests use $MT_PACKED_MPIEXEC ($MPIEXEC_BUILT is not on this machine)"
    fi
    echo "prebuilt by bench/gpu_pack.sh" >"$LOG/build.log"
else
    GEN=()
    command -v ninja >/dev/null && GEN=(-G Ninja)
    CMAKE_EXTRA=()
    if [ -n "${MT_DEPS_PREFIX:-}" ]; then
        PC="$MT_DEPS_PREFIX/lib/pkgconfig:$MT_DEPS_PREFIX/lib/x86_64-linux-gnu/pkgconfig"
        export PKG_CONFIG_PATH="$PC:${PKG_CONFIG_PATH:-}"
        export LD_LIBRARY_PATH="$MT_DEPS_PREFIX/lib:$MT_DEPS_PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
        export PATH="$MT_DEPS_PREFIX/bin:$PATH"
        CMAKE_EXTRA=(-DCMAKE_PREFIX_PATH="$MT_DEPS_PREFIX" -DMPI_HOME="$MT_DEPS_PREFIX")
    fi
    if ! run configure 120 cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DMT_WERROR=OFF "${CMAKE_EXTRA[@]}"; then
        say "configure failed: meshtrain needs MPI, hwloc and OpenBLAS besides CUDA (see $LOG/configure.log;"
        say "set MT_DEPS_PREFIX to a prefix holding them, docs/gpu.md 'Running gpu_check')"
        exit 1
    fi
    if ! grep -q "CUDA=1" "$LOG/configure.log"; then
        say "configure did not enable CUDA (see $LOG/configure.log)"
        exit 1
    fi
    # the other gpu-labelled tests of the tree (the NCCL backend's), when this build has them
    if cmake --build "$BUILD" --target help 2>/dev/null | grep -q test_coll_nccl; then
        TARGETS+=(test_coll_nccl)
    fi
    if ! run build 240 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"; then
        say "build failed (see $LOG/build.log)"
        exit 1
    fi
fi

# ---- GPU tests --------------------------------------------------------------------------------------
(cd "$BUILD" && run ctest-gpu 240 ctest -L gpu --output-on-failure --timeout 120)
TESTS_RC=$?
TESTS_LINE=$(grep -E "tests passed|tests failed" "$LOG/ctest-gpu.log" | tail -1)
# ctest counts a skipped test (exit 77) as passed: on a machine with a GPU only test_nvml (no NVML) may skip,
# and the two-rank NCCL tests (the backend, the GPU training engine's dp/pp and tp: one GPU per rank) where
# there is only one GPU; the staged ones (coll_staged_*, job_cuda_staged_*, job_cuda_shared_np2: ranks sharing
# a GPU through MPI) must run everywhere
NGPU=$(grep -c '^GPU [0-9]' "$LOG/nvidia-smi-L.log")
SKIPPED=$(grep -E '^[[:space:]]*[0-9]+ - .*\(Skipped\)' "$LOG/ctest-gpu.log" | sed 's/.* - \([^ ]*\) .*/\1/' |
    tr '\n' ' ')
for t in $SKIPPED; do
    case "$t" in
    test_nvml) ;;
    coll_nccl_np2 | job_cuda_np2 | job_cuda_tp2) [ "$NGPU" -ge 2 ] && TESTS_RC=1 &&
        say "GPU test $t was skipped on a machine with $NGPU GPUs: counted as a failure" ;;
    *)
        say "GPU test $t was skipped on a machine with a GPU: counted as a failure"
        TESTS_RC=1
        ;;
    esac
done

BENCH="$BUILD/bench/gpu_bench"
# ---- dense matrix peak (the MFU denominator, measured in this run) ---------------------------------
run peak 40 "$BENCH" peak -n 8192 -r 10
PEAK_BF16=$(awk '/^RESULT peak/ { for (i = 1; i <= NF; i++) if ($i ~ /^bf16=/) { sub("bf16=", "", $i); print $i } }' \
    "$LOG/peak.log")
PEAK_BF16=${PEAK_BF16:-0}

# ---- GPT-2 124M training per precision --------------------------------------------------------------
for p in bf16 fp16 tf32 fp32; do
    run "train-$p" 60 "$BENCH" train -p "$p" -B "$B" -T 1024 -n "$STEPS" --peak "$PEAK_BF16"
done
# bf16 at other micro-batches (MT_GPU_CHECK_EXTRA_B="32 64"): how MFU grows as the batch fills the device
for b in ${MT_GPU_CHECK_EXTRA_B:-}; do
    run "train-bf16-B$b" 60 "$BENCH" train -p bf16 -B "$b" -T 1024 -n "$STEPS" --peak "$PEAK_BF16"
done
# bf16 with model.head_chunks = 8: the logits a chunk at a time, recomputed in backward (less memory, more FLOPs)
run train-bf16-hk8 60 "$BENCH" train -p bf16 -B "$B" -T 1024 -n "$STEPS" --peak "$PEAK_BF16" --head-chunks 8

# ---- the same model through `meshtrain train` on the GPU (its training loop, data, clipping, metrics) ------
MT="$BUILD/meshtrain"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run train-meshtrain-bf16 90 "$MT" train "$SRC/launch/configs/gpt2-124m.toml" --runtime.device=cuda \
    --precision.compute=bf16 --parallel.engine=ddp --data.kind=synthetic --train.global_batch="$B" \
    --train.micro_batch="$B" --train.grad_accum=1 --train.steps=$((STEPS + 2)) --train.eval_every=0 \
    --train.log_every=1 --checkpoint.dir= --metrics.jsonl="$LOG/train-meshtrain-bf16.jsonl"
# the planner's device memory and step time for that run (plan/plan_mem_gpu.c) against its metrics
run plan-check 30 "$MT" plan "$SRC/launch/configs/gpt2-124m.toml" --cluster "$SRC/launch/clusters/hgx-h200.toml" \
    --world 1 --check "$LOG/train-meshtrain-bf16.jsonl" --runtime.device=cuda --precision.compute=bf16 \
    --parallel.engine=ddp --data.kind=synthetic --train.global_batch="$B" --train.micro_batch="$B" \
    --train.grad_accum=1

# ---- two GPUs (when there are): the same model over dp 2, tp 2 and tp 2 + sp (1 and 4 comm chunks), pp 2 ---------
MPIRUN=${MT_PACKED_MPIEXEC:-$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
LAYOUTS2=()
if [ "$NGPU" -ge 2 ] && [ -x "$MPIRUN" ]; then
    # NAME|OVERRIDES: every layout steps B sequences per GPU-pair micro-batch of B (dp 2: B per GPU)
    ONE="--train.micro_batch=$B --train.grad_accum=1"
    LAYOUTS2=("dp2|--parallel.tp=1 --train.global_batch=$((2 * B)) $ONE"
        "tp2|--parallel.tp=2 --train.global_batch=$B $ONE"
        "tp2c4|--parallel.tp=2 --parallel.tp_comm_chunks=4 --train.global_batch=$B $ONE"
        "tp2sp|--parallel.tp=2 --parallel.sequence_parallel=true --train.global_batch=$B $ONE"
        "tp2spc4|--parallel.tp=2 --parallel.sequence_parallel=true --parallel.tp_comm_chunks=4 --train.global_batch=$B
            $ONE"
        "pp2|--parallel.tp=1 --parallel.pp=2 --parallel.schedule=1f1b --train.global_batch=$((2 * B))
            --train.micro_batch=$((B / 2)) --train.grad_accum=4")
    for lay in "${LAYOUTS2[@]}"; do
        name=${lay%%|*} over=${lay#*|}
        # shellcheck disable=SC2086 # the overrides are words
        run "train2-$name" 90 "$MPIRUN" -np 2 "$MT" train "$SRC/launch/configs/gpt2-124m.toml" --runtime.device=cuda \
            --precision.compute=bf16 --parallel.engine=ddp --data.kind=synthetic $over --train.steps=$((STEPS + 2)) \
            --train.eval_every=0 --train.log_every=1 --checkpoint.dir=
    done
elif [ "$NGPU" -ge 2 ]; then
    say "two-GPU runs skipped: no mpiexec at '$MPIRUN'"
fi

# the bf16 step broken down by kernel category (a separate short run: the events slow the step slightly)
run train-bf16-profile 60 "$BENCH" train -p bf16 -B "$B" -T 1024 -n 3 --profile

# ---- attention: flash-style kernels (tensor cores for bf16, and forced onto CUDA cores) against the plain version
run attn 40 "$BENCH" attn -p bf16 -B 8 -T 1024 -C 768 -H 12 -r 10

# ---- every kernel of a bf16 step on its own, against the ceilings measured in the same run ------------------
run ops 60 "$BENCH" ops -p bf16 -r 20

# ---- compute-sanitizer over the kernel tests (MT_GPU_CHECK_SANITIZE=1): memcheck, and racecheck where shared
# memory is shared between warps ------------------------------------------------------------------------------
SAN_LINES=()
if [ -n "${MT_GPU_CHECK_SANITIZE:-}" ]; then
    CS=$(command -v compute-sanitizer || find /usr/local -path '*/bin/compute-sanitizer' 2>/dev/null | head -1)
    if [ -z "$CS" ]; then
        say "MT_GPU_CHECK_SANITIZE: no compute-sanitizer on this machine"
    else
        for tool_fam in memcheck:matmul memcheck:layernorm memcheck:elementwise memcheck:softmax_ce \
            memcheck:attention_tc racecheck:attention_tc racecheck:layernorm; do
            tool=${tool_fam%%:*} fam=${tool_fam#*:}
            run "$tool-$fam" 60 "$CS" --tool "$tool" --error-exitcode 9 "$BUILD/tests/gpu/test_gpu_ops" "$fam"
            rc=$?
            SAN_LINES+=("$tool $fam: exit $rc, $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool-$fam.log" |
                sed 's/^=* *//' | tr '\n' ' ')")
            [ "$rc" -ne 0 ] && TESTS_RC=1
        done
    fi
fi

# ---- collective benchmarks on the GPU: NCCL (one rank); the staged backend (MPI through pinned host memory)
# on one rank and on two ranks sharing the GPU, at the same sizes ----------------------------------------
if "$MT" bench coll --help >/dev/null 2>&1; then
    run nccl 40 "$MT" bench coll --backend nccl --op allreduce -b 8 -e 256M -f 4 -n 20 -w 5
    run staged 40 "$MT" bench coll --backend staged --op allreduce -b 8 -e 256M -f 4 -n 20 -w 5
    if [ -x "$MPIRUN" ]; then
        run staged2 60 "$MPIRUN" -np 2 --oversubscribe "$MT" bench coll --backend staged --op allreduce -b 8 \
            -e 256M -f 4 -n 20 -w 5
    fi
else
    say "nccl: meshtrain has no 'bench coll' in this build (collectives not merged?)"
fi

# ---- table ------------------------------------------------------------------------------------------
field() { # field FILE KEY: value of KEY=... on the RESULT line of FILE
    awk -v k="$2" '/^RESULT/ { for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == k) print a[2] } }' \
        "$1" 2>/dev/null | tail -1
}
{
    echo
    echo "== meshtrain gpu_check: $(head -1 "$LOG/nvidia-smi-L.log") =="
    VERDICT=FAIL
    [ "$TESTS_RC" -eq 0 ] && VERDICT=pass
    echo "GPU tests: ${TESTS_LINE:-not run}; skipped: ${SKIPPED:-none} (verdict: $VERDICT)"
    PEAK_LINE=$(grep '^RESULT peak' "$LOG/peak.log" 2>/dev/null | cut -d' ' -f3-)
    echo "dense matrix peak, TFLOP/s (cuBLASLt 8192^3): ${PEAK_LINE:-not measured (see $LOG/peak.log)}"
    echo
    printf "%-6s %10s %10s %8s %10s %10s %12s\n" prec "tokens/s" "ms/step" "MFU" "peak GiB" "J/step" "tokens/J"
    train_row() { # train_row LABEL LOGFILE: one row of the table from gpu_bench train's RESULT line
        if grep -q '^RESULT train' "$2" 2>/dev/null; then
            printf "%-6s %10s %10s %7.1f%% %10s %10s %12s\n" "$1" "$(field "$2" tok_s)" "$(field "$2" ms_step)" \
                "$(awk -v m="$(field "$2" mfu)" 'BEGIN { print m * 100 }')" "$(field "$2" peak_gib)" \
                "$(field "$2" energy_j)" "$(field "$2" tokens_per_j)"
        else
            printf "%-6s %10s   (see %s)\n" "$1" "FAILED" "$2"
        fi
    }
    for p in fp32 tf32 bf16 fp16; do
        train_row "$p" "$LOG/train-$p.log"
    done
    for b in ${MT_GPU_CHECK_EXTRA_B:-}; do
        train_row "B=$b" "$LOG/train-bf16-B$b.log"
    done
    train_row "hk=8" "$LOG/train-bf16-hk8.log"
    echo "(GPT-2 124M, B=$B (B=n rows: bf16 at that micro-batch; hk=8: bf16 with model.head_chunks = 8), T=1024;"
    echo " MFU against the bf16 peak above, of model FLOPs (hk=8's recomputed head product not counted);"
    echo " J/step 0 = NVML not available)"
    # meshtrain train: the steady-state rate and MFU of its summary (against the bf16 peak the engine measured
    # at its start, the same 8192^3 product as gpu_bench peak), and MFU as gpu_bench's bf16 (same FLOPs per
    # token, this run's peak); J/step the mean energy_j of the steady steps (absent without NVML)
    f="$LOG/train-meshtrain-bf16.log"
    TOKS=$(sed -n 's/.*steady state (steps \([0-9]*\)-[0-9]*): \([0-9]*\) tok\/s.*/\1 \2/p' "$f" 2>/dev/null | tail -1)
    if [ -n "$TOKS" ]; then
        from=${TOKS%% *} toks=${TOKS##* }
        ej=$(awk -v from="$from" -F'"energy_j": ' 'NF > 1 { split($1, a, "\"step\": "); split(a[2], b, ",");
            if (b[1] + 0 >= from + 0) { split($2, c, ","); s += c[1]; n++ } } END { if (n) printf "%.1f", s / n }' \
            "$LOG/train-meshtrain-bf16.jsonl" 2>/dev/null)
        # gpu_bench's bf16 MFU per token/s (its FLOPs per token over the peak) times this rate
        bm=$(field "$LOG/train-bf16.log" mfu) bt=$(field "$LOG/train-bf16.log" tok_s)
        mfu=$(awk -v t="$toks" -v m="${bm:-0}" -v r="${bt:-0}" 'BEGIN { if (m > 0 && r > 0) printf "%.1f%%", 100 * m * t / r; else print "n/a" }')
        own=$(sed -n 's/.*steady state (steps [0-9]*-[0-9]*): [0-9]* tok\/s, MFU \([0-9.]*%\).*/\1/p' "$f" | tail -1)
        mfu="${own:-n/a} (its own peak; ${mfu} against gpu_bench's)"
        tpj=$(awk -v t="$toks" -v e="${ej:-0}" -v b="$B" 'BEGIN { if (e > 0) printf "%.1f", b * 1024 / e; else print "-" }')
        printf "meshtrain train --runtime.device=cuda bf16: %s tokens/s (steady, from step %s), MFU %s, J/step %s, tokens/J %s\n" \
            "$toks" "$from" "$mfu" "${ej:--}" "$tpj"
    else
        echo "meshtrain train --runtime.device=cuda bf16: FAILED (see $f)"
    fi
    # two GPUs: each layout's steady rate, its MFU (the engine's, against the summed peaks of both GPUs) and its
    # rate against twice the one-GPU run's (TOKS above)
    for lay in ${LAYOUTS2[@]+"${LAYOUTS2[@]}"}; do
        name=${lay%%|*}
        f2="$LOG/train2-$name.log"
        t2=$(sed -n 's/.*steady state (steps [0-9]*-[0-9]*): \([0-9]*\) tok\/s.*/\1/p' "$f2" 2>/dev/null | tail -1)
        m2=$(sed -n 's/.*steady state (steps [0-9]*-[0-9]*): [0-9]* tok\/s, MFU \([0-9.]*%\).*/\1/p' "$f2" | tail -1)
        if [ -n "$t2" ]; then
            eff=$(awk -v a="$t2" -v b="${toks:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / (2 * b); else print "n/a" }')
            printf "2 GPUs, meshtrain train bf16, %-8s %s tokens/s, MFU %s, %s of 2 x one GPU's rate\n" "$name:" "$t2" \
                "${m2:-n/a}" "$eff"
        else
            echo "2 GPUs, meshtrain train bf16, $name: FAILED (see $f2)"
        fi
    done
    if grep -q '^RESULT prof' "$LOG/train-bf16-profile.log" 2>/dev/null; then
        echo "bf16 step by kernel category (ms per step, share):"
        sed -n '/^time per step by kernel/,/^RESULT prof/p' "$LOG/train-bf16-profile.log" | grep '^  '
    fi
    echo
    if grep -q '^RESULT attn' "$LOG/attn.log" 2>/dev/null; then
        path() {
            if [ "$(field "$LOG/attn.log" "mma_${1#tc_}")" = 1 ]; then
                echo "mma.sync"
            elif [ "$(field "$LOG/attn.log" "$1")" = 1 ]; then echo "WMMA"; else echo "CUDA cores"; fi
        }
        echo "attention bf16 B=8 T=1024 C=768 H=12 (ms):"
        printf "  %-46s %10s %10s\n" kernel forward backward
        printf "  %-46s %10s %10s\n" "flash: fwd $(path tc_fwd), bwd $(path tc_bwd)" \
            "$(field "$LOG/attn.log" flash_fwd_ms)" "$(field "$LOG/attn.log" flash_bwd_ms)"
        printf "  %-46s %10s %10s\n" "flash on WMMA tensor cores (ATTN_TC=2)" "$(field "$LOG/attn.log" wmma_fwd_ms)" \
            "$(field "$LOG/attn.log" wmma_bwd_ms)"
        printf "  %-46s %10s %10s\n" "flash on CUDA cores (ATTN_TC=0)" "$(field "$LOG/attn.log" simt_fwd_ms)" \
            "$(field "$LOG/attn.log" simt_bwd_ms)"
        printf "  %-46s %10s %10s\n" "plain (stores T x T)" "$(field "$LOG/attn.log" plain_fwd_ms)" "-"
    else
        echo "attention: FAILED (see $LOG/attn.log)"
    fi
    if grep -q '^RESULT ops' "$LOG/ops.log" 2>/dev/null; then
        echo "bf16 kernels alone (gpu_bench ops: time, rate, share of the ceiling, calls and time per step):"
        grep '^  ' "$LOG/ops.log"
    fi
    for l in ${SAN_LINES[@]+"${SAN_LINES[@]}"}; do
        echo "compute-sanitizer $l"
    done
    if grep -q '^verdict' "$LOG/plan-check.log" 2>/dev/null; then
        echo "meshtrain plan --check of the meshtrain train run (device memory by category, step time):"
        grep -E '^(params|grads|optimizer|activations|comm|peak|step|verdict) ' "$LOG/plan-check.log"
    fi
    for b in "nccl|NCCL all-reduce (1 GPU, 1 rank)" "staged|staged all-reduce (1 GPU, 1 rank)" \
        "staged2|staged all-reduce (1 GPU, 2 ranks)"; do
        if [ -f "$LOG/${b%%|*}.log" ]; then
            echo "${b#*|}:"
            grep -E "^ *#|^ +[0-9]" "$LOG/${b%%|*}.log" | tail -4
        fi
    done
    echo "total $(($(date +%s) - START)) s; logs in $LOG"
} | tee "$LOG/table.txt"
[ "$TESTS_RC" -eq 0 ]
