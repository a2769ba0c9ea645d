#!/usr/bin/env python3
"""Validates a meshtrain Chrome trace: JSON, one named process per rank, spans with the required
fields, and (optionally) that given span names appear on every rank.
usage: check_trace.py TRACE.json N_RANKS [REQUIRED_NAME ...]"""
import json
import sys


def main():
    path, n_ranks, required = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    errors = []
    if sorted(procs) != list(range(n_ranks)):
        errors.append(f"processes {sorted(procs)} != ranks 0..{n_ranks - 1}")
    for pid, name in procs.items():
        if not name.startswith(f"rank {pid} ("):
            errors.append(f"process {pid} named {name!r}")
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        for k in ("pid", "tid", "ts", "dur", "name", "cat", "args"):
            if k not in e:
                errors.append(f"span without {k}: {e}")
        if e.get("dur", 0) < 0:
            errors.append(f"negative duration: {e}")
    for name in required:
        have = {e["pid"] for e in spans if e["name"] == name}
        if have != set(range(n_ranks)):
            errors.append(f"span {name!r} on ranks {sorted(have)}, expected all {n_ranks}")
    for err in errors:
        print("check_trace:", err)
    print(f"check_trace: {len(events)} events, {len(spans)} spans, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
