#!/usr/bin/env bash
# Resharding: checkpoints written under one layout resume under another and the losses continue within
# 1e-5 (relative) of an uninterrupted run (SGD with momentum: the engines' equivalence bound). The chain:
#   ref   2 ranks DDP, 8 steps                                   (the uninterrupted run)
#   w     2 ranks ZeRO-3, 8 steps, checkpoints after 4 and 8 -> A
#   r1    1 process  (local)   from A/step-4, checkpoints every 2 -> B    steps 5-8 vs ref
#   r2    4 ranks ZeRO-1        from B/step-6                              steps 7-8 vs ref
#   r3    2 ranks ZeRO-2        from A/step-4, checkpoint after 6 -> C     steps 5-8 vs ref
#   r4    4 ranks DDP           from C/step-6                              steps 7-8 vs ref
#   r5    2 ranks ZeRO-3        from B/step-6 (written by 1 process)       steps 7-8 vs ref
#   r6    2 ranks ZeRO-3        from A/step-4: the same layout             steps 5-8 EQUAL to w's (bit for bit)
#   r7    2 ranks DP            from A/step-4, checkpoint after 6 -> E     steps 5-8 vs ref (optimizer on rank 0 only)
#   r8    4 ranks ZeRO-2        from E/step-6 (written by DP)              steps 7-8 vs ref
# and `meshtrain export` reads A (ZeRO-3 shards) and B (one process) into the same llm.c file format.
#   reshard.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/reshard_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/reshard_lib.sh"
train_setup reshard "$@"
# shellcheck disable=SC2034 # used by run() of reshard_lib.sh
common=(--parallel.tp=1 --train.steps=8 --train.global_batch=8 --train.micro_batch=0 --train.grad_accum=1
        --optimizer.kind=sgd --optimizer.momentum=0.9 --optimizer.lr=0.05 --optimizer.warmup_steps=0
        --train.log_every=100 --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory=)
run ref 2 --parallel.engine=ddp
run w 2 --parallel.engine=zero --parallel.zero_stage=3 --checkpoint.dir="$dir/A" --checkpoint.every=4
run r1 1 --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/B" --checkpoint.every=2 --checkpoint.keep=5
run r2 4 --parallel.engine=zero --parallel.zero_stage=1 --checkpoint.resume="$dir/B/step-00000006"
run r3 2 --parallel.engine=zero --parallel.zero_stage=2 --checkpoint.resume="$dir/A/step-00000004" \
    --checkpoint.dir="$dir/C" --checkpoint.every=2
run r4 4 --parallel.engine=ddp --checkpoint.resume="$dir/C/step-00000006"
run r5 2 --parallel.engine=zero --parallel.zero_stage=3 --checkpoint.resume="$dir/B/step-00000006"
run r6 2 --parallel.engine=zero --parallel.zero_stage=3 --checkpoint.resume="$dir/A/step-00000004"
run r7 2 --parallel.engine=dp --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/E" --checkpoint.every=2
run r8 4 --parallel.engine=zero --parallel.zero_stage=2 --checkpoint.resume="$dir/E/step-00000006"
reshard_check r6 w:1 r1:5 r2:7 r3:5 r4:7 r5:7 r7:5 r8:7
for src in A B; do
    "$bin" export --llmc "$dir/$src.bin" "$dir/$src/step-00000008" >"$dir/export$src.out" 2>&1 \
        || { cat "$dir/export$src.out"; echo "reshard: export from $src failed"; exit 1; }
done
[ "$(stat -c %s "$dir/A.bin")" = "$(stat -c %s "$dir/B.bin")" ] || { echo "reshard: exports differ in size"; exit 1; }
echo "reshard: ok"
