#!/usr/bin/env bash
# A damaged checkpoint is refused before anything is read from it or allocated by it: `meshtrain train`
# resuming from it exits 2 on every rank with the message given, and nothing in the checkpoint directory
# changes (no file rewritten, no new step written). The checkpoint is written by the same layout first
# (1 rank: the local engine; 4 ranks: ZeRO-3, so every rank's shard file holds data).
#   ckpt_hostile.sh NP CASE REGEX MESHTRAIN EXPECT_EXIT MPIEXEC [MPIEXEC_FLAGS...]
#   CASE: shape (a tensor's shape in the manifest disagrees with the model the config builds), absurd (a
#   shape whose size would overflow any allocation), truncated (the last rank's shard file is shorter than
#   the manifest says)
# SPDX-License-Identifier: MIT
set -u
np=$1 case=$2 regex=$3 bin=$4 expect=$5 mpiexec=$6
shift 6
flags=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(train --parallel.tp=1 --parallel.pp=1 --model.n_layer=2 --model.n_embd=32 --model.n_head=2
      --model.seq_len=16 --model.vocab_size=64 --train.global_batch=8 --train.micro_batch=2 --train.eval_every=0
      --metrics.jsonl= --profile.trace= --profile.memory= --checkpoint.dir="$dir/ck" --checkpoint.every=2)
launch=()
if [ "$np" -gt 1 ]; then
    args+=(--parallel.engine=zero --parallel.zero_stage=3)
    launch=("$mpiexec" -n "$np" "${flags[@]}")
fi
"${launch[@]}" "$bin" "${args[@]}" --train.steps=2 >"$dir/out" 2>&1 \
    || { cat "$dir/out"; echo "ckpt_hostile: writing the checkpoint failed"; exit 1; }
step="$dir/ck/step-00000002"
last=$(printf 'rank-%05d.bin' $((np - 1)))
case $case in
shape | absurd)
    python3 - "$step/manifest.json" "$case" <<'PY'
import json, sys
path, case = sys.argv[1], sys.argv[2]
m = json.load(open(path))
for t in m["tensors"]:
    if t["name"] == ("param/wpe" if case == "shape" else "param/wte"):
        t["shape"] = [32, 32] if case == "shape" else [4294967296, 4294967296]
json.dump(m, open(path, "w"), indent=1)
PY
    ;;
truncated)
    size=$(stat -c %s "$step/$last")
    truncate -s $((size / 2)) "$step/$last"
    ;;
*)
    echo "ckpt_hostile: unknown case $case"; exit 1 ;;
esac
before=$(cd "$dir/ck" && find . -type f -exec sha256sum {} + | sort)
status=0
"$expect" "$([ "$np" -gt 1 ] && echo "$np" || echo 0)" 2 "$regex" 60 "$mpiexec" "${flags[@]}" -- \
    "$bin" "${args[@]}" --train.steps=4 --checkpoint.resume=auto || status=1
after=$(cd "$dir/ck" && find . -type f -exec sha256sum {} + | sort)
if [ "$before" != "$after" ]; then
    echo "ckpt_hostile: the checkpoint directory changed:"; diff <(echo "$before") <(echo "$after"); status=1
fi
echo "ckpt_hostile $case np $np: $([ $status -eq 0 ] && echo ok || echo FAILED)"
exit $status
