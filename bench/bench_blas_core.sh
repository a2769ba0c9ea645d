#!/usr/bin/env bash
# What the OpenBLAS kernel is worth to training, side by side in one run: `meshtrain train` on one rank
# (both cores) with runtime.blas_core = each x86-64 kernel this CPU executes, plus auto, on GPT-2
# L4 C256 H4 T256 B8 V4096 (issue 42's configuration). For each: the kernel the start-up line names, the
# f32 vector peak and the sgemm rate measured at its start (cache off: every kernel measures its own),
# steady-state tokens/s, MFU and the ratio to sgemm. Kernels the CPU cannot run are reported and skipped
# (meshtrain refuses them with exit 2). The environment's OPENBLAS_CORETYPE is left alone: with it set,
# every row but auto/keep is refused, which is the point.
#   bench/bench_blas_core.sh [BUILD_DIR] [STEPS]     (defaults: build, 12)
# SPDX-License-Identifier: MIT
set -u
build=${1:-build}
steps=${2:-12}
bin=$build/meshtrain
if [ ! -x "$bin" ]; then
    echo "bench_blas_core: $bin not found: build first (cmake -S . -B $build -G Ninja && cmake --build $build)" >&2
    exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(train --parallel.tp=1 --model.n_layer=4 --model.n_embd=256 --model.n_head=4 --model.seq_len=256
      --model.vocab_size=4096 --train.global_batch=8 --train.micro_batch=8 --train.steps="$steps"
      --train.log_every="$steps" --train.eval_every=0 --checkpoint.dir= --metrics.jsonl= --profile.trace=
      --profile.memory=)
printf "%s\n" "host: $(hostname), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
printf "load before: %s\n\n" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-14s %-12s %14s %14s %10s %8s %10s %s\n" request kernel "peak GF/s/core" "sgemm GF/s" "tok/s" MFU "of sgemm" \
    "final loss"
for core in auto Prescott Nehalem Sandybridge Haswell Zen SkylakeX; do
    out=$tmp/$core.log
    MESHTRAIN_SGEMM_CACHE=off "$bin" "${args[@]}" --runtime.blas_core="$core" >"$out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        why=$(grep -m1 -o 'needs .*, which this CPU does not execute' "$out" || tail -1 "$out")
        printf "%-14s %s\n" "$core" "refused (exit $rc): $why"
        continue
    fi
    kernel=$(sed -n 's/^matrix library: [^,]*, kernel \([A-Za-z0-9]*\).*/\1/p' "$out")
    peak=$(sed -n 's/.*peak f32 [^ ]* \([0-9.]*\) GFLOP\/s per core.*/\1/p' "$out")
    sgemm=$(sed -n 's/.*; sgemm \([0-9.]*\) GFLOP\/s = .*/\1/p' "$out")
    line=$(grep -m1 '^summary:' "$out")
    tps=$(sed -n 's/.*steady state (steps [0-9]*-[0-9]*): \([0-9]*\) tok\/s.*/\1/p' <<<"$line")
    mfu=$(sed -n 's/.*, MFU \([0-9.]*%\).*/\1/p' <<<"$line")
    ofs=$(sed -n 's/.*(\([0-9.]*%\) of sgemm).*/\1/p' <<<"$line")
    loss=$(sed -n 's/.*final train loss \([0-9.]*\).*/\1/p' <<<"$line")
    printf "%-14s %-12s %14s %14s %10s %8s %10s %s\n" "$core" "${kernel:-?}" "${peak:-?}" "${sgemm:-?}" "${tps:-?}" \
        "${mfu:-?}" "${ofs:-?}" "${loss:-?}"
done
printf "\nload after: %s\n" "$(cut -d' ' -f1-3 /proc/loadavg)"
echo "peak: f32 FMA chains on one core x cores (docs/metrics.md); sgemm: 1024^3 with the job's OpenBLAS threads"
