#!/usr/bin/env bash
# meshtrain against PyTorch on the CPU: the same GPT-2 training step (n_layer 4, n_embd 256, n_head 4,
# seq 256, batch 8, vocabulary 4096; forward, backward, gradient clipping at 1.0, AdamW lr 3e-4 betas
# (0.9, 0.95) eps 1e-8 no weight decay; random tokens; one process on THREADS cores) in fp32 and bf16, in
# `meshtrain train` and in transformers' GPT2LMHeadModel (bench/pytorch_gpt2_step.py), run one after the
# other, then a table of tokens/s and the ratio meshtrain/PyTorch. Builds meshtrain if BUILD/meshtrain is
# missing; installs torch and transformers from PyPI into a throw-away virtual environment (reused when
# present; the first install downloads a few GB and takes minutes).
#   usage: bench/bench_vs_pytorch.sh [BUILD]      (BUILD: build directory, default build; relative paths
#                                                  are taken from the repository root)
#   environment: MT_BENCH_STEPS (timed steps, default 10), MT_BENCH_THREADS (cores/threads, default nproc),
#   MT_BENCH_WARMUP (PyTorch's untimed steps first, default 3), MT_BENCH_VENV (virtual environment, default
#   ${TMPDIR:-/tmp}/meshtrain-bench-venv), MT_BENCH_TORCH_INDEX (a pip index URL for torch, e.g. PyTorch's
#   CPU-only wheels, instead of PyPI)
# The OpenBLAS settings OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left exactly as the caller has them.
# SPDX-License-Identifier: MIT
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
cd "$SRC" || exit 2
BUILD=${1:-build}
STEPS=${MT_BENCH_STEPS:-10}
WARMUP=${MT_BENCH_WARMUP:-3}
NPROC=$(nproc 2>/dev/null || echo 1)
THREADS=${MT_BENCH_THREADS:-$NPROC}
VENV=${MT_BENCH_VENV:-${TMPDIR:-/tmp}/meshtrain-bench-venv}
die() {
    echo "bench_vs_pytorch: $*" >&2
    exit 1
}
case "$STEPS$THREADS$WARMUP" in
*[!0-9]*) die "MT_BENCH_STEPS, MT_BENCH_THREADS and MT_BENCH_WARMUP must be integers" ;;
esac
[ "$STEPS" -ge 2 ] || die "MT_BENCH_STEPS must be at least 2 (meshtrain's steady state starts at step 2)"
if [ "$THREADS" -lt 1 ] || [ "$THREADS" -gt "$NPROC" ]; then die "MT_BENCH_THREADS must be in 1..$NPROC"; fi
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-bench-XXXXXX") || die "cannot make a log directory"

# 1. meshtrain, built only when the binary is missing.
if [ ! -x "$BUILD/meshtrain" ]; then
    echo "== building meshtrain in $BUILD"
    { cmake -S . -B "$BUILD" -G Ninja && cmake --build "$BUILD"; } || die "build failed"
fi
MT=$(cd "$BUILD" && pwd)/meshtrain

# 2. The virtual environment with torch and transformers.
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
    echo "== creating the virtual environment $VENV"
    python3 -m venv "$VENV" ||
        die "python3 -m venv $VENV failed: install the venv module (Debian: apt-get install python3-venv)"
fi
if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
    echo "== installing torch and transformers into $VENV (log: $LOGS/pip.log)"
    T0=$(date +%s)
    idx=()
    [ -n "${MT_BENCH_TORCH_INDEX:-}" ] && idx=(--index-url "$MT_BENCH_TORCH_INDEX")
    if ! { "$PY" -m pip install "${idx[@]}" torch && "$PY" -m pip install transformers; } \
        >"$LOGS/pip.log" 2>&1; then
        tail -n 15 "$LOGS/pip.log" >&2
        die "pip install of torch/transformers into $VENV failed (see $LOGS/pip.log). PyPI must be reachable
  (check the network or proxy, then run again), or point MT_BENCH_VENV at a virtual environment that already
  has torch and transformers, or set MT_BENCH_TORCH_INDEX to a reachable index holding torch wheels."
    fi
    "$PY" -c 'import torch, transformers' ||
        die "torch/transformers installed but do not import (see $LOGS/pip.log)"
    echo "== installed in $(($(date +%s) - T0)) s"
fi

# 3. Header.
VERS=$("$PY" -c 'import torch, transformers as t; print("torch", torch.__version__, "transformers", t.__version__)')
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
BF16=$(grep -o -w -m 1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
LOAD0=$(cut -d ' ' -f 1-3 /proc/loadavg)
echo "== meshtrain vs PyTorch: GPT-2 training step, CPU"
echo "host $(hostname) | nproc $NPROC | threads $THREADS | CPU ${CPU:-unknown} | bf16 instructions: ${BF16:-none}"
echo "$VERS | venv $VENV | steps $STEPS (PyTorch: after $WARMUP warm-up steps) | logs $LOGS"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>} (as given)"
echo "load average before: $LOAD0"

# 4. The runs, alternating meshtrain and PyTorch per precision so that both see similar load.
PIN=()
# Fewer threads than cores: pin meshtrain to that many cores (it sizes its thread pools to its cores).
[ "$THREADS" -lt "$NPROC" ] && PIN=(taskset -c "0-$((THREADS - 1))")
# mt_cmd PRECISION / py_cmd PRECISION: set CMD to the command line of that run.
mt_cmd() {
    CMD=("${PIN[@]}" "$MT" train --parallel.tp=1 --model.n_layer=4 --model.n_embd=256 --model.n_head=4
        --model.seq_len=256 --model.vocab_size=4096 --data.kind=synthetic --train.global_batch=8
        --train.micro_batch=8 "--train.steps=$STEPS" "--train.log_every=$STEPS" --train.eval_every=0
        --optimizer.kind=adamw --optimizer.lr=3e-4 --optimizer.beta1=0.9 --optimizer.beta2=0.95
        --optimizer.eps=1e-8 --optimizer.weight_decay=0 --optimizer.grad_clip=1.0 --optimizer.warmup_steps=0
        --optimizer.schedule=constant --checkpoint.dir= --metrics.jsonl= --profile.trace= --profile.memory=
        --profile.steps= "--precision.compute=$1")
}
py_cmd() {
    CMD=("$PY" "$SRC/bench/pytorch_gpt2_step.py" --precision "$1" --steps "$STEPS" --warmup "$WARMUP"
        --threads "$THREADS")
}
declare -A MTS PTS
BLASLINE='' MESHLINE='' MMLINE='' ATTN=''
for p in fp32 bf16; do
    echo "-- meshtrain $p"
    mt_cmd $p
    (cd "$LOGS" && "${CMD[@]}") >"$LOGS/meshtrain-$p.log" 2>&1 ||
        { tail -n 20 "$LOGS/meshtrain-$p.log" >&2; die "meshtrain $p failed (log: $LOGS/meshtrain-$p.log)"; }
    summary=$(grep '^summary:' "$LOGS/meshtrain-$p.log" | tail -n 1)
    echo "   $summary"
    MTS[$p]=$(echo "$summary" | sed -n 's/.*steady state ([^)]*): \([0-9.]*\) tok\/s.*/\1/p')
    [ -n "${MTS[$p]}" ] || die "no steady-state tok/s in meshtrain's summary line (log: $LOGS/meshtrain-$p.log)"
    [ -n "$BLASLINE" ] || BLASLINE=$(grep -m 1 '^matrix library:' "$LOGS/meshtrain-$p.log")
    [ -n "$MESHLINE" ] || MESHLINE=$(grep -m 1 '^mesh:' "$LOGS/meshtrain-$p.log")
    [ -n "$MMLINE" ] || MMLINE=$(grep -m 1 '^matrix products:' "$LOGS/meshtrain-$p.log")
    echo "-- pytorch $p"
    py_cmd $p
    "${CMD[@]}" >"$LOGS/pytorch-$p.log" 2>&1 ||
        { tail -n 20 "$LOGS/pytorch-$p.log" >&2; die "PyTorch $p failed (log: $LOGS/pytorch-$p.log)"; }
    line=$(grep "^pytorch $p tok/s" "$LOGS/pytorch-$p.log" | tail -n 1)
    echo "   $line"
    PTS[$p]=$(echo "$line" | awk '{print $4}')
    [ -n "${PTS[$p]}" ] || die "no tok/s line from PyTorch (log: $LOGS/pytorch-$p.log)"
    ATTN=$(echo "$line" | sed -n 's/.* attn \([^ ]*\).*/\1/p')
done
LOAD1=$(cut -d ' ' -f 1-3 /proc/loadavg)

# 5. The table.
echo
echo "meshtrain: $BLASLINE"
echo "meshtrain: $MESHLINE"
echo "meshtrain: $MMLINE"
echo "pytorch: GPT2LMHeadModel, attention $ATTN, torch.set_num_threads($THREADS);" \
    "bf16 = autocast around forward + loss, fp32 master weights"
echo "tok/s: meshtrain's steady state (steps 2-$STEPS, from its summary line); PyTorch's 8*256 / median step time"
echo
printf '%-10s %16s %14s  %s\n' precision "meshtrain tok/s" "pytorch tok/s" "ratio (meshtrain/pytorch)"
for p in fp32 bf16; do
    ratio=$(awk -v a="${MTS[$p]}" -v b="${PTS[$p]}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    note=
    # runtime.matmul = auto: bf16 products on oneDNN where the CPU has AMX/AVX512-BF16, else emulated
    [ "$p" = bf16 ] && case "$MMLINE" in
        *"bf16 oneDNN"* | *"bf16 brg"*) note="   (meshtrain: bf16 products on oneDNN, f32 accumulation)" ;;
        *) note="   (meshtrain: bf16 emulated: rounds to bf16, products computed in f32)" ;;
    esac
    printf '%-10s %16s %14s  %s%s\n' "$p" "${MTS[$p]}" "${PTS[$p]}" "$ratio" "$note"
done
echo
echo "load average before: $LOAD0 | after: $LOAD1"
echo "commands (meshtrain's run in $LOGS):"
for p in fp32 bf16; do
    mt_cmd $p
    echo "  ${CMD[*]}"
    py_cmd $p
    echo "  ${CMD[*]}"
done
