#!/bin/sh
# `meshtrain train` (or its alias `train3d`) on NP ranks must print the same per-step losses, gradient norms
# and validation losses as `meshtrain train` on one rank (the single-process run), within TOL relative, every
# step logged; both runs write a checkpoint after the last step, exported with `meshtrain export --llmc`,
# and the final parameters (gathered from every stage, tp shard and ZeRO shard) must agree within TOL
# relative to the largest parameter (max-norm and 2-norm of the difference), while training moved them
# from the initial weights by at least 100 times that difference.
# usage: train_vs_serial.sh MESHTRAIN NP TOL SUBCOMMAND CONFIG MPIEXEC [MPIEXEC FLAGS...] -- [--key=value
#        overrides for both] [-- overrides for the parallel run only]
# SPDX-License-Identifier: MIT
set -u
bin=$1; np=$2; tol=$3; sub=$4; cfg=$5; shift 5
launcher=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher="$launcher $1"; shift; done
[ $# -gt 0 ] && shift
common=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do common="$common $1"; shift; done
[ $# -gt 0 ] && shift
onlypar="$*"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
quiet="--train.log_every=1 --metrics.jsonl= --profile.trace= --profile.memory= --runtime.bind=none"
"$bin" train "$cfg" --parallel.tp=1 --parallel.pp=1 $quiet --checkpoint.dir="$dir/ck1" $common > "$dir/serial.txt" 2>&1 || {
    echo "FAIL: meshtrain train (one process) failed:"; cat "$dir/serial.txt"; exit 1; }
$launcher -np "$np" "$bin" "$sub" "$cfg" $quiet --checkpoint.dir="$dir/ckN" $common $onlypar > "$dir/par.txt" 2>&1 || {
    echo "FAIL: meshtrain $sub on $np ranks failed:"; cat "$dir/par.txt"; exit 1; }
grep -e '^mesh:' -e '^meshtrain train' "$dir/par.txt"
# "step N/M | loss X | lr .. | norm Y |" and "step N/M | val loss Z (..)"
extract() { sed -n -e 's/^step *\([0-9]*\)\/[0-9]* | loss \([^ ]*\) | lr [^|]*| norm \([^ ]*\) .*/\1 loss \2 norm \3/p' \
                   -e 's/^step *\([0-9]*\)\/[0-9]* | val loss \([^ ]*\) .*/\1 val \2/p' "$1"; }
extract "$dir/serial.txt" > "$dir/a"
extract "$dir/par.txt" > "$dir/b"
if [ "$(grep -c loss "$dir/a")" -lt 5 ] || [ "$(wc -l < "$dir/a")" != "$(wc -l < "$dir/b")" ]; then
    echo "FAIL: fewer than 5 steps or different numbers of progress lines"; cat "$dir/serial.txt" "$dir/par.txt"; exit 1
fi
paste "$dir/a" "$dir/b" | awk -v tol="$tol" '
    function rel(x, y) { d = x - y; if (d < 0) d = -d; m = y < 0 ? -y : y; return m > 0 ? d / m : d }
    function num(x) { return x ~ /^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$/ }
    { for (i = 3; i <= NF / 2; i += 2) {
          a = $i; b = $(i + NF / 2)
          if (!num(a) || !num(b)) { printf "FAIL step %s %s: serial %s, parallel %s\n", $1, $(i - 1), a, b; bad++; continue }
          e = rel(b, a); n++
          if (e > tol) { printf "FAIL step %s %s: parallel %s, serial %s (rel %.2e)\n", $1, $(i - 1), b, a, e; bad++ }
          if (e > worst) worst = e } }
    END { printf "%d values compared, largest relative difference %.2e (tolerance %s)\n", n, worst, tol; exit bad > 0 }' \
    || exit 1
for k in 1 N; do
    "$bin" export --llmc "$dir/$k.bin" "$dir/ck$k" > "$dir/export$k.txt" 2>&1 || {
        echo "FAIL: export of the $k-rank checkpoint failed"; cat "$dir/export$k.txt"; exit 1; }
done
# the initial weights (the configuration's random initialisation), so the check can see training moved them
"$bin" export --llmc "$dir/0.bin" "$cfg" --parallel.tp=1 --parallel.pp=1 $common > "$dir/export0.txt" 2>&1 || {
    echo "FAIL: export of the initial weights failed"; cat "$dir/export0.txt"; exit 1; }
python3 - "$dir/1.bin" "$dir/N.bin" "$tol" "$dir/0.bin" <<'PY' || exit 1
import array, math, sys
def params(path):
    """The parameters of an llm.c checkpoint, wte without its padded rows (tp pads the vocabulary further)."""
    h, a = array.array("i"), array.array("f")
    with open(path, "rb") as f:
        h.frombytes(f.read(256 * 4))
        a.frombytes(f.read())
    V, C, Vp = h[3], h[6], h[7]
    return a[:V * C] + a[Vp * C:]
ref, got, tol = params(sys.argv[1]), params(sys.argv[2]), float(sys.argv[3])
assert len(ref) == len(got) and len(ref) > 0, (len(ref), len(got))
dmax = max(abs(x - y) for x, y in zip(ref, got))
d2 = math.sqrt(sum((x - y) ** 2 for x, y in zip(ref, got)))
rmax, r2 = max(abs(x) for x in ref), math.sqrt(sum(x * x for x in ref))
print(f"final parameters: {len(ref)} values, max |diff| {dmax:.3g} (largest |p| {rmax:.3g}), "
      f"|diff|_2 / |p|_2 {d2 / r2:.3g}")
init = params(sys.argv[4])
assert len(init) == len(ref), ("the initial weights are another model", len(init), len(ref))
moved = math.sqrt(sum((x - y) ** 2 for x, y in zip(ref, init)))
print(f"training moved the parameters by |final - initial|_2 = {moved:.3g}, 100x the difference at least")
if dmax > tol * rmax or d2 > tol * r2:
    print(f"FAIL: final parameters differ beyond {tol} relative")
    sys.exit(1)
if moved < 100 * d2 or moved == 0:
    print("FAIL: the parameters hardly moved: the comparison would not see a wrong update")
    sys.exit(1)
PY
