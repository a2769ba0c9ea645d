#!/usr/bin/env bash
# Resharding across tensor and pipeline parallelism: checkpoints written under tp2 x dp2, tp2 x pp2,
# tp2 x pp2 x dp2 with ZeRO-2 and one process resume under each other and under the data-parallel engines, the losses within 1e-5 (relative)
# of an uninterrupted run (SGD with momentum); the same layout resumes bit for bit; export reads a
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
bin=$1 mpiexec=$2
shift 2
flags=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--train.steps=8 --train.global_batch=8 --train.micro_batch=2 --train.grad_accum=0 --parallel.dp=0
        --optimizer.kind=sgd --optimizer.momentum=0.9 --optimizer.lr=0.05 --optimizer.warmup_steps=0
        --train.log_every=100 --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory= --parallel.engine=ddp)
run() { # name np args...
    local name=$1 np=$2
    shift 2
    local cmd=("$bin" train "${common[@]}" --metrics.jsonl="$dir/$name.jsonl" "$@")
    if [ "$np" -gt 1 ]; then
        cmd=("$mpiexec" -n "$np" "${flags[@]}" "${cmd[@]}")
    fi
    if ! "${cmd[@]}" >"$dir/$name.out" 2>&1; then
        cat "$dir/$name.out"
        echo "reshard_mp: run $name failed"
        exit 1
    fi
}
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
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return {o["step"]: o["loss"] for o in map(json.loads, open(f"{d}/{name}.jsonl"))}
ref = losses("ref")
assert sorted(ref) == list(range(1, 9)), ref
bad = 0
for name, first in (("w", 1), ("r1", 5), ("r2", 7), ("r3", 5), ("r4", 5), ("r5", 5), ("r6", 7), ("r7", 7),
                    ("r8", 5), ("r9", 7), ("r10", 7)):
    got = losses(name)
    assert sorted(got) == list(range(first, 9)), f"{name}: steps {sorted(got)}, expected {first}..8"
    for s, l in got.items():
        rel = abs(l - ref[s]) / abs(ref[s])
        ok = rel <= 1e-5
        bad += not ok
        print(f"reshard_mp: {name} step {s}: loss {l:.9f} ref {ref[s]:.9f} rel {rel:.2e} {'ok' if ok else 'TOO FAR'}")
w, r5 = losses("w"), losses("r5")
for s in range(5, 9):
    if r5[s] != w[s]:
        bad += 1
        print(f"reshard_mp: r5 step {s}: {r5[s]!r} != {w[s]!r}: a same-layout resume must be bit-identical")
assert ref[8] < ref[1], "the reference run learns"
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || { echo "reshard_mp: losses diverge from the uninterrupted run"; exit 1; }
"$bin" export --llmc "$dir/C.bin" "$dir/C/step-00000008" >"$dir/exportC.out" 2>&1 \
    || { cat "$dir/exportC.out"; echo "reshard_mp: export from a tp2 x pp2 checkpoint failed"; exit 1; }
echo "reshard_mp: ok"
