#!/usr/bin/env bash
# The model-parallel engine's comm_bytes in metrics.jsonl (docs/metrics.md) against the design's count,
# computed here from the model's shape alone. `meshtrain train` with the tiny GPT-2 (L blocks, width C,
# padded vocabulary Vp, m micro-batches of B x T tokens: N = B*T rows), every rank's own metrics file:
#   tp (group of n): per micro-batch, forward: the vocabulary-parallel embedding's all-reduce (N*C floats),
#     two per block (attention, MLP: N*C each), the cross-entropy's row maxima (N) and sums (2N); backward:
#     two per block and the head's input gradient (N*C). Each all-reduce of b bytes counts 2b(n-1)/n.
#   tp with sequence parallelism: each of those N*C all-reduces becomes a reduce-scatter (forward: the
#     embedding's and each block's two row-parallel outputs; backward: each block's two column-parallel input
#     gradients and the head's) or an all-gather (forward: each block's two column-parallel inputs and the
#     head's; backward: each block's two row-parallel output gradients and the embedding's), each counting
#     b(n-1)/n of the whole N*C buffer b; the row maxima and sums stay all-reduces. Once per step the
#     gradients of the replicated parameters the stage holds (LayerNorms, row-parallel biases, wpe) are
#     all-reduced over tp, one all-reduce per module; under ZeRO-2/3, which reduce-scatter every pass's
#     gradients over dp, after every micro-batch instead. Pipeline messages carry the rank's N/n rows.
#   pp: stage s sends m activations forward (s < pp-1) and m gradients back (s > 0), each N*C floats plus a
#     tag float; the first and last stage all-reduce the tied wte gradient (Vp/tp x C floats) over 2 ranks.
#   dp (built-in all-reduce, DDP): the stage's held parameters (tp shards, the tied copy), 2b(dp-1)/dp.
#   dp (ZeRO, units padded to a multiple of 16 x dp floats, each reduce-scatter or all-gather b(dp-1)/dp of
#     the padded unit): ZeRO-1 one bucket of the held parameters, reduce-scattered and all-gathered once per
#     step; ZeRO-2 that bucket reduce-scattered every micro-batch, except a tied wte read on another stage
#     too (pp > 1), a unit of its own reduce-scattered once per step, and every unit all-gathered once per
#     step; ZeRO-3 one unit per module (wte alone, as it is tied), every unit a module reads gathered for its
#     forward and again for its backward (wte: by the embedding and again by the head when both are on the
#     stage) and reduce-scattered every micro-batch (a wte read on another stage: once per step).
#   other: the norm's sums over tp and pp (and over dp inside an engine) and the loss's dp mean (8-byte
#     all-reduces), the loss broadcast over pp (4 bytes, b(n-1)/n, truncated to whole bytes).
# Set "tp_pp_dp": tp 2 on 2 ranks, and tp 2 x pp 2 x dp 2 on 8 ranks (stage_layers 1,1) with the built-in
# dp all-reduce and with DDP (which counts its gradients the same way). Set "sp_zero": sequence parallelism
# (tp 2 on 2 ranks; tp 2 x pp 2 on 4) and ZeRO-1/2/3 over pp 2 x dp 2 and ZeRO-2/3 over tp 2 (sp) x dp 2
# (4 ranks). model = tp + pp + dp on every rank and step.
#   mp_comm_bytes.sh SET MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../jobs/train_lib.sh"
set_name=$1
shift
train_setup mp_comm_bytes "$@"
V=64 VP=128 L=2 C=32 NH=2 T=16 GB=8 STEPS=3
common=(--model.kind=gpt2 --model.vocab_size=$V --model.padded_vocab=$VP --model.n_layer=$L --model.n_embd=$C
        --model.n_head=$NH --model.seq_len=$T --train.steps=$STEPS --train.global_batch=$GB --train.micro_batch=0
        --train.grad_accum=2 --train.eval_every=0 --train.log_every=100 --optimizer.kind=sgd --optimizer.lr=0.05
        --optimizer.warmup_steps=0 --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory=
        --metrics.per_rank=true --parallel.order=tp-dp-pp)
# name, ranks, tp, pp, dp, dp engine (allreduce, ddp, zero1..3), sequence parallel: the python below reads
# the same table
case $set_name in
tp_pp_dp)
    layouts="tp2 2 2 1 1 allreduce 0
tp2pp2dp2 8 2 2 2 allreduce 0
tp2pp2dp2_ddp 8 2 2 2 ddp 0" ;;
sp_zero)
    layouts="tp2_sp 2 2 1 1 allreduce 1
tp2pp2_sp 4 2 2 1 allreduce 1
pp2dp2_zero1 4 1 2 2 zero1 0
pp2dp2_zero2 4 1 2 2 zero2 0
pp2dp2_zero3 4 1 2 2 zero3 0
tp2dp2_sp_zero2 4 2 1 2 zero2 1
tp2dp2_sp_zero3 4 2 1 2 zero3 1" ;;
*) echo "mp_comm_bytes: unknown set '$set_name' (tp_pp_dp or sp_zero)"; exit 1 ;;
esac
while read -r name np tp pp dp eng sp; do
    sp_on=false
    [ "$sp" = 1 ] && sp_on=true
    args=(--parallel.tp="$tp" --parallel.pp="$pp" --parallel.sequence_parallel="$sp_on")
    [ "$pp" -gt 1 ] && args+=("--parallel.stage_layers=1,1")
    case $eng in
    allreduce) [ "$dp" -gt 1 ] && args+=(--parallel.dp_reduce=allreduce) ;;
    ddp) args+=(--parallel.dp_reduce=engine --parallel.engine=ddp) ;;
    zero*) args+=(--parallel.dp_reduce=engine --parallel.engine=zero --parallel.zero_stage="${eng#zero}") ;;
    esac
    run "$name" "$np" "${args[@]}" </dev/null # mpiexec would read the rest of the table
done <<<"$layouts"
python3 - "$dir" $V $VP $L $C $T $GB $STEPS "$layouts" <<'PY'
import json, sys
d = sys.argv[1]
V, VP, L, C, T, GB, STEPS = map(int, sys.argv[2:9])
M = 2  # train.grad_accum

def allreduce(nbytes, n):
    return 2 * nbytes * (n - 1) // n if n > 1 else 0

def gather(nbytes, n):  # an all-gather or reduce-scatter of a whole buffer of nbytes
    return nbytes * (n - 1) // n if n > 1 else 0

def pad(floats, n):  # a sharded engine unit's length
    a = 16 * n
    return (floats + a - 1) // a * a

def expected(tp, pp, dp, stage, eng, sp):
    """Bytes one rank of stage `stage` sends per step, by group, from the model's shape."""
    N = GB // (dp * M) * T  # rows per micro-batch
    R = N // tp if sp else N  # rows of the activations this rank holds and sends
    first, last = stage == 0, stage == pp - 1
    blocks = L // pp        # stage_layers 1,1 (or all L on one stage)
    if not sp:
        fwd = (N * C if first else 0) + 2 * blocks * N * C + (N + 2 * N if last else 0)
        bwd = 2 * blocks * N * C + (N * C if last else 0)
        tp_b = M * (allreduce(4 * fwd, tp) + allreduce(4 * bwd, tp))
    else:
        # reduce-scatters and all-gathers of N*C floats per micro-batch: forward embedding (RS), blocks
        # (AG, RS, AG, RS), head (AG); backward head (RS), blocks (AG, RS, AG, RS), embedding (AG)
        n_rs_ag = (2 if first else 0) + 8 * blocks + (2 if last else 0)
        tp_b = M * (n_rs_ag * gather(4 * N * C, tp) + (allreduce(4 * N, tp) + allreduce(4 * 2 * N, tp) if last else 0))
        # the replicated gradients' sum, one all-reduce per module: once per step, or (ZeRO-2/3, which
        # reduce-scatter each pass's gradients over dp) after every pass
        passes = M if eng in ("zero2", "zero3") else 1
        per_module = [6 * C] * blocks + ([T * C] if first else []) + ([2 * C] if last else [])
        tp_b += passes * sum(allreduce(4 * f, tp) for f in per_module)
    msg = 4 * (R * C + 1)
    pp_b = M * msg * ((stage < pp - 1) + (stage > 0))
    wte = VP // tp * C
    if pp > 1 and (first or last):
        pp_b += allreduce(4 * wte, 2)
    # parameters this stage holds: tp shards of the sharded ones, replicated ones whole
    block = (12 * C * C + 7 * C) // tp + 6 * C
    has_wte = first or last
    held = blocks * block + (wte if has_wte else 0) + (T * C if first else 0) + (2 * C if last else 0)
    once = pp > 1 and has_wte  # the tied wte is read on another stage too
    if eng in ("allreduce", "ddp"):
        dp_b = allreduce(4 * held, dp)
    elif eng == "zero1":
        dp_b = 2 * gather(4 * pad(held, dp), dp)
    elif eng == "zero2":
        main = pad(held - (wte if once else 0), dp)
        tied = pad(wte, dp) if once else 0
        dp_b = M * gather(4 * main, dp) + gather(4 * tied, dp) + gather(4 * (main + tied), dp)
    else:  # zero3: units wte, wpe (embedding), one per block, ln_f (head)
        units = {"blk%d" % b: pad(block, dp) for b in range(blocks)}
        reads = [["blk%d" % b] for b in range(blocks)]
        if has_wte:
            units["wte"] = pad(wte, dp)
        if first:
            units["wpe"] = pad(T * C, dp)
            reads.append(["wte", "wpe"])
        if last:
            units["lnf"] = pad(2 * C, dp)
            reads.append(["lnf", "wte"])
        gathered = sum(units[u] for r in reads for u in r)
        every_mb = sum(v for k, v in units.items() if not (once and k == "wte"))
        dp_b = M * (2 * gather(4 * gathered, dp) + gather(4 * every_mb, dp))
        dp_b += gather(4 * units["wte"], dp) if once else 0
    other = allreduce(8, tp) + allreduce(8, pp) + allreduce(8, dp) + (4 * (pp - 1) // pp)
    if eng != "allreduce":  # the engine also sums the norm over dp
        other += allreduce(8, dp)
    return {"tp": tp_b, "pp": pp_b, "dp": dp_b, "other": other}

bad = 0
for line in sys.argv[9].splitlines():
    name, _, tp, pp, dp, eng, sp = line.split()
    tp, pp, dp, sp = int(tp), int(pp), int(dp), sp == "1"
    world = tp * pp * dp
    for r in range(world):
        stage = r // (tp * dp)  # mesh order tp-dp-pp: tp fastest, pp slowest
        want = expected(tp, pp, dp, stage, eng, sp)
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
