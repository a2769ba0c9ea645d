#!/usr/bin/env bash
# DP through `meshtrain train` follows the DataParallel pattern: dp rank 0 alone reads the training data
# (the rows of its whole group) and scatters every micro-batch; the run computes the same function as one
# process. For GPT-2 (SGD, 1e-5 relative) and the MLP (AdamW, 1e-4: its division by sqrt(v) magnifies
# rounding in near-zero gradients), on 2 and 3 ranks with 2 micro-batches per step, and for llm.c token
# shards (with per-rank validation) on 2 ranks, it checks from the per-rank metrics files:
#   - every step's loss (and validation loss) against the single-process run;
#   - data_rows: rank 0 read the global batch every step, every other rank read nothing;
#   - comm_bytes.other: rank 0 sent exactly the scattered tokens more than each other rank,
#     2 (inputs, targets) x grad_accum x (N-1) x micro_batch x seq_len x 4 bytes per step;
#   - the start-up line that says so.
#   dp_scatter.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"
train_setup dp_scatter "$@"
B=12 GA=2 STEPS=5
common=(--parallel.tp=1 --train.steps=$STEPS --train.global_batch=$B --train.micro_batch=0 --train.grad_accum=$GA
        --optimizer.warmup_steps=0 --train.log_every=100 --runtime.bind=none --checkpoint.dir= --profile.trace=
        --profile.memory= --metrics.per_rank=true)
gpt2=(--model.kind=gpt2 --model.vocab_size=64 --model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.seq_len=16
      --optimizer.kind=sgd --optimizer.momentum=0.9 --optimizer.lr=0.05)
mlp=(--model.kind=mlp --model.n_layer=2 --model.n_embd=48 --model.seq_len=16 --optimizer.kind=adamw
     --optimizer.lr=0.003)
# llm.c token shards: 2 train files, 1 validation file
python3 - "$dir" <<'PY'
import random, struct, sys
d = sys.argv[1]
rng = random.Random(7)
for name, n in (("train_0.bin", 3000), ("train_1.bin", 2500), ("val_0.bin", 2000)):
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *[(3 * i + rng.randrange(2)) % 64 for i in range(n)]))
PY
shards=(--data.kind=shards --data.train="$dir/train_*.bin" --data.val="$dir/val_*.bin" --train.eval_every=$STEPS
        --train.eval_batches=2)
run gpt2_ref 1 "${gpt2[@]}"
run gpt2_dp2 2 "${gpt2[@]}" --parallel.engine=dp
run gpt2_dp3 3 "${gpt2[@]}" --parallel.engine=dp
run mlp_ref 1 "${mlp[@]}"
run mlp_dp2 2 "${mlp[@]}" --parallel.engine=dp
run mlp_dp3 3 "${mlp[@]}" --parallel.engine=dp
run shards_ref 1 "${gpt2[@]}" "${shards[@]}"
run shards_dp2 2 "${gpt2[@]}" "${shards[@]}" --parallel.engine=dp
for r in gpt2_dp2 gpt2_dp3 mlp_dp3 shards_dp2; do
    grep -q "data: dp rank 0 loads the $B rows of each step for its [23]-rank group and scatters every micro-batch" \
        "$dir/$r.out" || { cat "$dir/$r.out"; echo "dp_scatter: $r does not say that rank 0 scatters"; exit 1; }
done
python3 - "$dir" $B $GA $STEPS <<'PY'
import json, sys
d, B, GA, STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
T = 16
def recs(name, rank=None):
    path = f"{d}/{name}.jsonl" if rank is None else f"{d}/{name}.rank{rank}.jsonl"
    return {o["step"]: o for o in map(json.loads, open(path))}
bad = 0
for ref, runs, tol in (("gpt2_ref", ("gpt2_dp2", "gpt2_dp3"), 1e-5), ("mlp_ref", ("mlp_dp2", "mlp_dp3"), 1e-4),
                       ("shards_ref", ("shards_dp2",), 1e-5)):
    want = recs(ref)
    assert sorted(want) == list(range(1, STEPS + 1)), f"{ref}: steps {sorted(want)}"
    assert want[STEPS]["loss"] < want[1]["loss"], f"{ref}: the reference run learns"
    for name in runs:
        n = int(name[-1])
        got = recs(name)
        for s in range(1, STEPS + 1):
            for key in ("loss", "val_loss"):
                if key not in want[s]:
                    continue
                rel = abs(got[s][key] - want[s][key]) / abs(want[s][key])
                ok = rel <= tol
                bad += not ok
                print(f"dp_scatter: {name} step {s} {key} {got[s][key]:.9f} ref {want[s][key]:.9f} rel {rel:.2e} "
                      f"(tol {tol:g}) {'ok' if ok else 'TOO FAR'}")
        per = [recs(name, r) for r in range(n)]
        mb = B // (n * GA)
        scatter = 2 * GA * (n - 1) * mb * T * 4
        for s in range(1, STEPS + 1):
            rows = [p[s]["data_rows"] for p in per]
            if rows != [B] + [0] * (n - 1):
                bad += 1
                print(f"dp_scatter: {name} step {s}: rows read per rank {rows}, expected [{B}] + zeros")
            other = [p[s]["comm_bytes"]["other"] for p in per]
            for r in range(1, n):
                if other[0] - other[r] != scatter:
                    bad += 1
                    print(f"dp_scatter: {name} step {s}: rank 0 sent {other[0]:.0f} other bytes, rank {r} "
                          f"{other[r]:.0f}: the difference should be the scatter, {scatter} bytes")
        print(f"dp_scatter: {name}: rank 0 read {B} rows per step and scattered {scatter} bytes; other ranks read 0")
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || { echo "dp_scatter: FAILED"; exit 1; }
echo "dp_scatter: ok"
