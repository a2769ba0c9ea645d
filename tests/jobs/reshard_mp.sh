#!/usr/bin/env bash
# Resharding across tensor and pipeline parallelism: checkpoints written under tp2 x dp2, tp2 x pp2,
# tp2 x pp2 x dp2 with ZeRO-2 and one process resume under each other and under the data-parallel
# engines, the losses within 1e-5 (relative) of an uninterrupted run (SGD with momentum); the same layout resumes bit for bit; export reads a
# tp2 x pp2 checkpoint.
#   ref   4 ranks DDP, 8 steps                                    (the uninterrupted run)
#   w     tp2 x dp2, checkpoints after 4 and 8 -> A
#   r1    1 process        from A/step-4, checkpoints every 2 -> B   steps 5-8 vs ref
#   r2    pp2 x dp2        from B/step-6                              steps 7-8 vs ref
#   r3    tp2 x pp2 (dp 1, ZeRO-1 asked: nothing to shard) from A/step-4, checkpoints every 2 -> C  steps 5-8
#   r4    2 ranks ZeRO-3   from A/step-4, checkpoints every 2 -> D    steps 5-8 vs ref
#   r5    tp2 x dp2        from A/step-4                              steps 5-8 EQUAL to w's
#   r6    tp2 x pp2        from D/step-6 (ZeRO-3 shards)              steps 7-8 vs ref
#   r7    4 ranks ZeRO-3   from C/step-6 (tp2 x pp2 shards)           steps 7-8 vs ref
#   r8    tp2 x pp2 x dp2 ZeRO-2 (8 ranks) from A/step-4, checkpoints every 2 -> E  steps 5-8 vs ref
#   r9    1 process        from E/step-6 (ZeRO-2 shards of tp shards of stages)    steps 7-8 vs ref
#   r10   tp2 x pp2 x dp2 ZeRO-3 from E/step-6                                     steps 7-8 vs ref
#   reshard_mp.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/reshard_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/reshard_lib.sh"
train_setup reshard_mp "$@"
# shellcheck disable=SC2034 # used by run() of reshard_lib.sh
common=(--train.steps=8 --train.global_batch=8 --train.micro_batch=2 --train.grad_accum=0 --parallel.dp=0
        --optimizer.kind=sgd --optimizer.momentum=0.9 --optimizer.lr=0.05 --optimizer.warmup_steps=0
        --train.log_every=100 --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory= --parallel.engine=ddp)
run ref 4 --parallel.tp=1 --parallel.pp=1
run w 4 --parallel.tp=2 --parallel.pp=1 --checkpoint.dir="$dir/A" --checkpoint.every=4
run r1 1 --parallel.tp=1 --parallel.pp=1 --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/B" \
    --checkpoint.every=2 --checkpoint.keep=5
run r2 4 --parallel.tp=1 --parallel.pp=2 --checkpoint.resume="$dir/B/step-00000006"
run r3 4 --parallel.tp=2 --parallel.pp=2 --parallel.engine=zero --parallel.zero_stage=1 \
    --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/C" --checkpoint.every=2
run r4 2 --parallel.tp=1 --parallel.pp=1 --parallel.engine=zero --parallel.zero_stage=3 \
    --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/D" --checkpoint.every=2
run r5 4 --parallel.tp=2 --parallel.pp=1 --checkpoint.resume="$dir/A/step-00000004"
run r6 4 --parallel.tp=2 --parallel.pp=2 --checkpoint.resume="$dir/D/step-00000006"
run r7 4 --parallel.tp=1 --parallel.pp=1 --parallel.engine=zero --parallel.zero_stage=3 \
    --checkpoint.resume="$dir/C/step-00000006"
run r8 8 --parallel.tp=2 --parallel.pp=2 --parallel.engine=zero --parallel.zero_stage=2 \
    --checkpoint.resume="$dir/A/step-00000004" --checkpoint.dir="$dir/E" --checkpoint.every=2
run r9 1 --parallel.tp=1 --parallel.pp=1 --checkpoint.resume="$dir/E/step-00000006"
run r10 8 --parallel.tp=2 --parallel.pp=2 --parallel.engine=zero --parallel.zero_stage=3 \
    --checkpoint.resume="$dir/E/step-00000006"
grep -q "engine tensor-parallel" "$dir/w.out" && grep -q "engine pipeline" "$dir/r3.out" \
    || { echo "reshard_mp: the runs did not use the model-parallel engines"; exit 1; }
reshard_check r5 w:1 r1:5 r2:7 r3:5 r4:5 r5:5 r6:7 r7:7 r8:5 r9:7 r10:7
"$bin" export --llmc "$dir/C.bin" "$dir/C/step-00000008" >"$dir/exportC.out" 2>&1 \
    || { cat "$dir/exportC.out"; echo "reshard_mp: export from a tp2 x pp2 checkpoint failed"; exit 1; }
echo "reshard_mp: ok"
