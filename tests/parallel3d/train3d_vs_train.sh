#!/bin/sh
# `meshtrain train3d` on NP ranks must print the same per-step losses, gradient norms and validation losses
# as `meshtrain train` on one rank (the single-process run): within 1e-4 relative (AdamW, the default
# optimizer of the embedded job), every step logged.
# usage: train3d_vs_train.sh MESHTRAIN NP MPIEXEC [MPIEXEC FLAGS...] -- [--key=value overrides for both]
#        [-- overrides for train3d only]
# SPDX-License-Identifier: MIT
set -u
bin=$1; np=$2; shift 2
launcher=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher="$launcher $1"; shift; done
[ $# -gt 0 ] && shift
common=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do common="$common $1"; shift; done
[ $# -gt 0 ] && shift
only3d="$*"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"$bin" train --parallel.tp=1 --parallel.pp=1 --train.log_every=1 $common > "$dir/serial.txt" 2>&1 || {
    echo "FAIL: meshtrain train failed:"; cat "$dir/serial.txt"; exit 1; }
$launcher -np "$np" "$bin" train3d --train.log_every=1 $common $only3d > "$dir/par.txt" 2>&1 || {
    echo "FAIL: meshtrain train3d failed:"; cat "$dir/par.txt"; exit 1; }
grep '^meshtrain train3d' "$dir/par.txt"
# "step N/M | loss X | lr .. | norm Y |" and "step N/M | val loss Z (..)"
extract() { sed -n -e 's/^step *\([0-9]*\)\/[0-9]* | loss \([^ ]*\) | lr [^|]*| norm \([^ ]*\) .*/\1 loss \2 norm \3/p' \
                   -e 's/^step *\([0-9]*\)\/[0-9]* | val loss \([^ ]*\) .*/\1 val \2/p' "$1"; }
extract "$dir/serial.txt" > "$dir/a"
extract "$dir/par.txt" > "$dir/b"
if [ ! -s "$dir/a" ] || [ "$(wc -l < "$dir/a")" != "$(wc -l < "$dir/b")" ]; then
    echo "FAIL: different numbers of progress lines"; cat "$dir/serial.txt" "$dir/par.txt"; exit 1
fi
# A value train3d does not compute prints as nan (the gradient norm with an engine under tp/pp): that one is
# skipped and counted; any other non-number fails.
paste "$dir/a" "$dir/b" | awk '
    function rel(x, y) { d = x - y; if (d < 0) d = -d; m = y < 0 ? -y : y; return m > 0 ? d / m : d }
    function num(x) { return x ~ /^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$/ }
    { for (i = 3; i <= NF / 2; i += 2) {
          a = $i; b = $(i + NF / 2)
          if ($(i - 1) == "norm" && b == "nan") { skipped++; continue }
          if (!num(a) || !num(b)) { printf "FAIL step %s %s: train %s, train3d %s\n", $1, $(i - 1), a, b; bad++; continue }
          e = rel(b, a); n++
          if (e > 1e-4) { printf "FAIL step %s %s: train3d %s, train %s (rel %.2e)\n", $1, $(i - 1), $(i + NF / 2), $i, e; bad++ }
          if (e > worst) worst = e } }
    END { printf "%d values compared (%d norms not computed by train3d), largest relative difference %.2e\n",
                n, skipped, worst; exit bad > 0 }'
