#!/usr/bin/env bash
# A checkpoint resumed under an optimizer without a buffer for its state (AdamW's moments under plain SGD):
# the run resumes its weights and step count and rank 0 warns, naming the state left behind and how to keep
# it; resumed under its own optimizer, no warning.
#   ckpt_optimizer.sh MESHTRAIN
# SPDX-License-Identifier: MIT
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--parallel.tp=1 --train.log_every=1 --metrics.jsonl= --profile.trace= --profile.memory=)
"$bin" train "${common[@]}" --train.steps=2 --checkpoint.every=2 --checkpoint.dir="$dir/ck" >"$dir/a.out" 2>&1 \
    || { cat "$dir/a.out"; echo "ckpt_optimizer: the adamw run failed"; exit 1; }
ck="$dir/ck/step-00000002"
"$bin" train "${common[@]}" --train.steps=3 --checkpoint.dir= --checkpoint.resume="$ck" --optimizer.kind=sgd \
    >"$dir/sgd.out" 2>&1 || { cat "$dir/sgd.out"; echo "ckpt_optimizer: the sgd resume failed"; exit 1; }
grep -q "resumed from checkpoint $ck (after step 2)" "$dir/sgd.out" \
    || { cat "$dir/sgd.out"; echo "ckpt_optimizer: the sgd run did not resume"; exit 1; }
grep -q "checkpoint $ck holds optimizer state (adamw.m, adamw.v) that optimizer.kind = \"sgd\" without momentum does not use" \
    "$dir/sgd.out" || { cat "$dir/sgd.out"; echo "ckpt_optimizer: no warning for the state left behind"; exit 1; }
"$bin" train "${common[@]}" --train.steps=3 --checkpoint.dir= --checkpoint.resume="$ck" >"$dir/same.out" 2>&1 \
    || { cat "$dir/same.out"; echo "ckpt_optimizer: the adamw resume failed"; exit 1; }
if grep -q "holds optimizer state" "$dir/same.out"; then
    cat "$dir/same.out"
    echo "ckpt_optimizer: warned with the checkpoint's own optimizer"
    exit 1
fi
echo "ckpt_optimizer: ok"
