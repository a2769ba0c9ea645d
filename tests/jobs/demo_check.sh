#!/usr/bin/env bash
# The default job (embedded launch/configs/demo.toml) on 4 ranks: the mesh is tp 2 x dp 2 on the tensor-
# parallel engine, the loss falls by more than 1.5 nats in 120 steps, validation follows it, and the
# metrics, the merged trace of all 4 ranks, the memory histories and a checkpoint are written where the
# job says.
#   demo_check.sh MESHTRAIN CHECK_TRACE_PY MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
bin=$1 check=$2 mpiexec=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
"$mpiexec" -n 4 "$@" "$bin" train --train.steps=120 --metrics.per_rank=true >log.txt 2>&1 || { cat log.txt; echo "demo_check: the default job failed"; exit 1; }
grep -q "^mesh: 4 ranks = tp 2 x dp 2 x pp 1" log.txt && grep -q "engine tensor-parallel" log.txt \
    || { cat log.txt; echo "demo_check: not the tp 2 x dp 2 composition"; exit 1; }
for f in out/demo/metrics.jsonl out/demo/metrics.rank3.jsonl out/demo/trace.json out/demo/memory.rank3.json out/demo/ckpt/step-00000120/manifest.json; do
    [ -s "$f" ] || { ls -R; echo "demo_check: $f missing"; exit 1; }
done
grep -q "trace of steps 20-22 written to out/demo/trace.json" log.txt || { echo "demo_check: no trace line"; exit 1; }
python3 "$check" out/demo/trace.json 4 step data embedding block.0 block.1 head optimizer "tp all_reduce" all_reduce \
    || exit 1
python3 - <<'PY' || exit 1
import json
rows = [json.loads(l) for l in open("out/demo/metrics.jsonl")]
first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-10:]) / 10
vals = [r["val_loss"] for r in rows if "val_loss" in r]
print(f"demo_check: loss {first:.3f} -> {last:.3f} (perfect 1.386), validation {vals[0]:.3f} -> {vals[-1]:.3f}")
assert len(rows) == 120, len(rows)
mine = [json.loads(l) for l in open("out/demo/metrics.rank3.jsonl")]
assert [r["step"] for r in mine] == list(range(1, 121)), "rank 3's own file has every step"
assert all(m["loss"] == r["loss"] for m, r in zip(mine, rows)), "every rank reports the global loss"
assert all(r["mem_bytes"]["peak"] >= m["mem_bytes"]["peak"] for m, r in zip(mine, rows)), "rank 0's is the max"

assert first - last > 1.5, "the loss falls clearly"
assert vals[-1] < vals[0] - 0.5 and abs(vals[-1] - last) < 0.2, "validation follows"
PY
echo "demo_check: ok"
