#!/usr/bin/env bash
# The model-parallel engine's comm_bytes in metrics.jsonl (docs/metrics.md) against the design's count,
# computed here from the model's shape alone. `meshtrain train` with the tiny GPT-2 (L blocks, width C,
# padded vocabulary Vp, m micro-batches of B x T tokens: N = B*T rows), every rank's own metrics file:
#   tp (group of n): per micro-batch, forward: the vocabulary-parallel embedding's all-reduce (N*C floats),
#     two per block (attention, MLP: N*C each), the cross-entropy's row maxima (N) and sums (2N); backward:
#     two per block and the head's input gradient (N*C). Each all-reduce of b bytes counts 2b(n-1)/n.
#   pp: stage s sends m activations forward (s < pp-1) and m gradients back (s > 0), each N*C floats plus a
#     tag float; the first and last stage all-reduce the tied wte gradient (Vp/tp x C floats) over 2 ranks.
#   dp (built-in all-reduce): the stage's held parameters (tp shards, the tied copy), 2b(dp-1)/dp.
#   other: the norm's sums over tp and pp (and over dp inside DDP) and the loss's dp mean (8-byte
#     all-reduces), the loss broadcast over pp (4 bytes, b(n-1)/n, truncated to whole bytes).
# tp 2 on 2 ranks, and tp 2 x pp 2 x dp 2 on 8 ranks (stage_layers 1,1) with the built-in dp all-reduce
# and with DDP (which counts its gradients the same way); model = tp + pp + dp on every rank and step.
#   mp_comm_bytes.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../jobs/train_lib.sh"
train_setup mp_comm_bytes "$@"
V=64 VP=128 L=2 C=32 NH=2 T=16 GB=8 STEPS=3
common=(--model.kind=gpt2 --model.vocab_size=$V --model.padded_vocab=$VP --model.n_layer=$L --model.n_embd=$C
        --model.n_head=$NH --model.seq_len=$T --train.steps=$STEPS --train.global_batch=$GB --train.micro_batch=0
        --train.grad_accum=2 --train.eval_every=0 --train.log_every=100 --optimizer.kind=sgd --optimizer.lr=0.05
        --optimizer.warmup_steps=0 --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory=
        --metrics.per_rank=true --parallel.order=tp-dp-pp)
run tp2 2 --parallel.tp=2
run tp2pp2dp2 8 --parallel.tp=2 --parallel.pp=2 --parallel.stage_layers=1,1 --parallel.dp_reduce=allreduce
run tp2pp2dp2_ddp 8 --parallel.tp=2 --parallel.pp=2 --parallel.stage_layers=1,1 --parallel.dp_reduce=engine \
    --parallel.engine=ddp
python3 - "$dir" $V $VP $L $C $T $GB $STEPS <<'PY'
import json, sys
d = sys.argv[1]
V, VP, L, C, T, GB, STEPS = map(int, sys.argv[2:])
M = 2  # train.grad_accum

def allreduce(nbytes, n):
    return 2 * nbytes * (n - 1) // n if n > 1 else 0

def expected(tp, pp, dp, stage, engine):
    """Bytes one rank of stage `stage` sends per step, by group, from the model's shape."""
    N = GB // (dp * M) * T  # rows per micro-batch
    first, last = stage == 0, stage == pp - 1
    blocks = L // pp        # stage_layers 1,1 (or all L on one stage)
    fwd = (N * C if first else 0) + 2 * blocks * N * C + (N + 2 * N if last else 0)
    bwd = 2 * blocks * N * C + (N * C if last else 0)
    tp_b = M * (allreduce(4 * fwd, tp) + allreduce(4 * bwd, tp))
    msg = 4 * (N * C + 1)
    pp_b = M * msg * ((stage < pp - 1) + (stage > 0))
    wte = VP // tp * C
    if pp > 1 and (first or last):
        pp_b += allreduce(4 * wte, 2)
    # parameters this stage holds: tp shards of the sharded ones, replicated ones whole
    block = (12 * C * C + 7 * C) // tp + 6 * C
    held = blocks * block + (wte if first or last else 0) + (T * C if first else 0) + (2 * C if last else 0)
    dp_b = allreduce(4 * held, dp)
    other = allreduce(8, tp) + allreduce(8, pp) + allreduce(8, dp) + (4 * (pp - 1) // pp)
    if engine:  # the engine also sums the norm over dp
        other += allreduce(8, dp)
    return {"tp": tp_b, "pp": pp_b, "dp": dp_b, "other": other}

bad = 0
for name, tp, pp, dp, engine in (("tp2", 2, 1, 1, False), ("tp2pp2dp2", 2, 2, 2, False),
                                 ("tp2pp2dp2_ddp", 2, 2, 2, True)):
    world = tp * pp * dp
    for r in range(world):
        stage = r // (tp * dp)  # mesh order tp-dp-pp: tp fastest, pp slowest
        want = expected(tp, pp, dp, stage, engine)
        recs = [json.loads(l) for l in open(f"{d}/{name}.rank{r}.jsonl")]
        assert [o["step"] for o in recs] == list(range(1, STEPS + 1)), f"{name} rank {r}: steps"
        for o in recs:
            got = o.get("comm_bytes")
            if got is None:
                bad += 1
                print(f"mp_comm_bytes: {name} rank {r} step {o['step']}: no comm_bytes")
                continue
            for k in ("tp", "pp", "dp", "other"):
                if got.get(k) != want[k]:
                    bad += 1
                    print(f"mp_comm_bytes: {name} rank {r} (stage {stage}) step {o['step']}: {k} {got.get(k)} bytes, "
                          f"the design counts {want[k]}")
            if got["model"] != got["tp"] + got["pp"] + got["dp"]:
                bad += 1
                print(f"mp_comm_bytes: {name} rank {r}: model {got['model']} != tp + pp + dp {got}")
        print(f"mp_comm_bytes: {name} rank {r} (stage {stage}): {recs[-1]['comm_bytes']} (design {want})")
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || { echo "mp_comm_bytes: FAILED"; exit 1; }
echo "mp_comm_bytes: ok"
