#!/usr/bin/env bash
# Atomicity: a job killed in the middle of its second checkpoint (shard files written and synced, no
# manifest, no rename) leaves the first one complete and `latest` pointing at it; the next run resumes
# from it and ends with the same losses as a run that was never interrupted; export reads it.
#   ckpt_crash.sh MESHTRAIN
# SPDX-License-Identifier: MIT
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--parallel.tp=1 --train.steps=6 --train.log_every=1 --checkpoint.every=2 --checkpoint.resume=auto
        --metrics.jsonl= --profile.trace= --profile.memory=)
"$bin" train "${common[@]}" --checkpoint.dir= >"$dir/plain.out" 2>&1 || { cat "$dir/plain.out"; echo "ckpt_crash: plain run failed"; exit 1; }
MESHTRAIN_CKPT_TEST_CRASH=2 "$bin" train "${common[@]}" --checkpoint.dir="$dir/ck" >"$dir/crash.out" 2>&1
rc=$?
[ "$rc" -eq 86 ] || { cat "$dir/crash.out"; echo "ckpt_crash: expected the test crash (86), got $rc"; exit 1; }
[ "$(cat "$dir/ck/latest")" = "step-00000002" ] || { ls -la "$dir/ck"; echo "ckpt_crash: latest moved"; exit 1; }
[ -d "$dir/ck/.tmp-step-00000004" ] && [ ! -e "$dir/ck/.tmp-step-00000004/manifest.json" ] \
    || { ls -laR "$dir/ck"; echo "ckpt_crash: expected a half-written temporary directory"; exit 1; }
[ ! -e "$dir/ck/step-00000004" ] || { echo "ckpt_crash: a half checkpoint looks complete"; exit 1; }
"$bin" train "${common[@]}" --checkpoint.dir="$dir/ck" >"$dir/resume.out" 2>&1 || { cat "$dir/resume.out"; echo "ckpt_crash: resume failed"; exit 1; }
grep -q "resumed from checkpoint $dir/ck/step-00000002 (after step 2)" "$dir/resume.out" \
    || { cat "$dir/resume.out"; echo "ckpt_crash: did not resume from step 2"; exit 1; }
for s in 3 4 5 6; do
    a=$(grep -E "^step +$s/6 \| loss" "$dir/plain.out" | sed 's/ | [0-9.]* ms.*//')
    b=$(grep -E "^step +$s/6 \| loss" "$dir/resume.out" | sed 's/ | [0-9.]* ms.*//')
    [ -n "$a" ] && [ "$a" = "$b" ] || { echo "ckpt_crash: step $s differs: '$a' vs '$b'"; exit 1; }
done
[ ! -e "$dir/ck/.tmp-step-00000004" ] || { echo "ckpt_crash: the stale temporary directory was not removed"; exit 1; }
"$bin" export --llmc "$dir/w.bin" "$dir/ck" >"$dir/export.out" 2>&1 || { cat "$dir/export.out"; echo "ckpt_crash: export failed"; exit 1; }
grep -q "from checkpoint $dir/ck/step-00000006" "$dir/export.out" || { cat "$dir/export.out"; echo "ckpt_crash: export did not say its source"; exit 1; }
echo "ckpt_crash: ok"
