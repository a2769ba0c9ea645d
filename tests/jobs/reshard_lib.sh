# shellcheck shell=bash
# Shared by reshard.sh and reshard_mp.sh: train_lib.sh (train_setup, run) and the check of every run's
# losses against the uninterrupted run `ref`. Sourced, not run.
# SPDX-License-Identifier: MIT

# shellcheck source=tests/jobs/train_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"

# reshard_check SAME NAME:FIRST...: run `ref` logged steps 1-8; each NAME logged steps FIRST-8, each loss
# within 1e-5 (relative) of ref's; run SAME (a resume of `w` under w's own layout at step 4) has losses
# equal to w's, bit for bit, at steps 5-8; ref learns. Exits 1 with the reason otherwise.
reshard_check() {
    if ! python3 - "$dir" "$tag" "$@" <<'PY'; then
import json, sys
d, tag, same = sys.argv[1:4]
runs = [(a.split(":")[0], int(a.split(":")[1])) for a in sys.argv[4:]]
def losses(name):
    return {o["step"]: o["loss"] for o in map(json.loads, open(f"{d}/{name}.jsonl"))}
ref = losses("ref")
assert sorted(ref) == list(range(1, 9)), ref
bad = 0
for name, first in runs:
    got = losses(name)
    assert sorted(got) == list(range(first, 9)), f"{name}: steps {sorted(got)}, expected {first}..8"
    for s, l in got.items():
        rel = abs(l - ref[s]) / abs(ref[s])
        ok = rel <= 1e-5
        bad += not ok
        print(f"{tag}: {name} step {s}: loss {l:.9f} ref {ref[s]:.9f} rel {rel:.2e} {'ok' if ok else 'TOO FAR'}")
w, r = losses("w"), losses(same)
for s in range(5, 9):
    if r.get(s) != w[s]:
        bad += 1
        print(f"{tag}: {same} step {s}: {r.get(s)!r} != {w[s]!r}: a same-layout resume must be bit-identical")
# the run continues to learn: the last loss is below the first
assert ref[8] < ref[1], "the reference run learns"
sys.exit(1 if bad else 0)
PY
        echo "$tag: losses diverge from the uninterrupted run"
        exit 1
    fi
}
