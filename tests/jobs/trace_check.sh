#!/usr/bin/env bash
# meshtrain train with profile.trace / profile.memory over steps 1-2: the trace is valid Chrome JSON with
# the required spans on the rank, the memory history is JSON with events, and the job says where they are.
#   trace_check.sh MESHTRAIN CHECK_TRACE_PY
# SPDX-License-Identifier: MIT
set -eu
bin=$1 check=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" train --parallel.tp=1 --train.steps=4 --checkpoint.dir="$dir/ck" --checkpoint.every=2 --metrics.jsonl= \
    --profile.trace="$dir/t/trace.json" --profile.steps=1-2 --profile.memory="$dir/mem.json" >"$dir/out" 2>&1 || {
    cat "$dir/out"; echo "trace_check: the job failed"; exit 1; }
grep -q "trace of steps 1-2 written to $dir/t/trace.json" "$dir/out" || { cat "$dir/out"; echo "trace_check: no trace line"; exit 1; }
python3 "$check" "$dir/t/trace.json" 1 step data embedding block.0 block.1 head "gradients: finish, norm, loss" \
    optimizer checkpoint
python3 - "$dir/t/trace.json" "$dir/mem.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in t if e.get("ph") == "X"]
steps = [e for e in spans if e["name"] == "step"]
assert len(steps) == 2, f"2 step spans (steps 1-2), got {len(steps)}"
for cat in ("forward", "backward"):
    names = {e["name"] for e in spans if e["cat"] == cat}
    assert {"embedding", "block.0", "block.1", "head"} <= names, f"{cat} spans per module: {names}"
# every module span lies inside a step span
for e in spans:
    if e["cat"] in ("forward", "backward"):
        assert any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1 for s in steps), e
m = json.load(open(sys.argv[2]))
assert m["events"], "memory history of steps 1-2 has events (activations allocated in step 1)"
assert "peak" in m, "breakdown at the peak"
print(f"trace_check: {len(spans)} spans, {len(m['events'])} memory events: ok")
PY
