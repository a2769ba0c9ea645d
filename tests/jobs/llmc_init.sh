#!/usr/bin/env bash
# model.init = "llmc:PATH" under every engine: an llm.c file (exported with another seed) starts one
# process, tp2 x dp2, pp2 x dp2 and ZeRO-3 on 4 ranks from the same weights: their losses agree within
# 1e-5 (relative) for 4 steps and differ from a random start.
#   llmc_init.sh MESHTRAIN MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"
train_setup llmc_init "$@"
# the default job's model (launch/configs/demo.toml), initialised from another seed
"$bin" export --llmc "$dir/w.bin" --model.n_layer=2 --model.n_head=4 --model.n_embd=64 --model.seq_len=32 \
    --model.vocab_size=64 --train.seed=7 >"$dir/export.out" 2>&1 || { cat "$dir/export.out"; echo "llmc_init: export failed"; exit 1; }
common=(--train.steps=4 --train.global_batch=8 --train.micro_batch=2 --train.grad_accum=0 --parallel.dp=0
        --optimizer.kind=sgd --optimizer.momentum=0.9 --optimizer.lr=0.05 --optimizer.warmup_steps=0
        --runtime.bind=none --checkpoint.dir= --profile.trace= --profile.memory= --parallel.engine=ddp)
run random 1 --parallel.tp=1
run one 1 --parallel.tp=1 --model.init=llmc:"$dir/w.bin"
run tp 4 --parallel.tp=2 --model.init=llmc:"$dir/w.bin"
run pp 4 --parallel.tp=1 --parallel.pp=2 --model.init=llmc:"$dir/w.bin"
run z3 4 --parallel.tp=1 --parallel.engine=zero --parallel.zero_stage=3 --model.init=llmc:"$dir/w.bin"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open(f"{d}/{n}.jsonl")]
one, rnd = L("one"), L("random")
assert abs(one[0] - rnd[0]) > 1e-4, f"the llm.c start differs from the random one: {one[0]} vs {rnd[0]}"
bad = 0
for n in ("tp", "pp", "z3"):
    for s, (a, b) in enumerate(zip(L(n), one), 1):
        rel = abs(a - b) / abs(b)
        bad += rel > 1e-5
        print(f"llmc_init: {n} step {s}: {a:.9f} vs one process {b:.9f} rel {rel:.2e}")
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || { echo "llmc_init: layouts disagree"; exit 1; }
echo "llmc_init: ok"
