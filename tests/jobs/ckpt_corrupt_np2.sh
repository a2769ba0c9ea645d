#!/usr/bin/env bash
# A corrupted shard that only one rank reads (ZeRO-3: rank 1 owns its pieces) stops every rank with exit
# status 2: rank 1 names the file and the CRC32C mismatch, rank 0 says another rank failed, nothing hangs.
#   ckpt_corrupt_np2.sh MESHTRAIN EXPECT_EXIT MPIEXEC [MPIEXEC_FLAGS...]
# SPDX-License-Identifier: MIT
set -u
bin=$1 expect=$2 mpiexec=$3
shift 3
flags=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(train --parallel.tp=1 --parallel.engine=zero --parallel.zero_stage=3 --checkpoint.dir="$dir/ck"
      --metrics.jsonl= --profile.trace= --profile.memory=)
"$mpiexec" -n 2 "${flags[@]}" "$bin" "${args[@]}" --train.steps=4 >"$dir/out" 2>&1 \
    || { cat "$dir/out"; echo "ckpt_corrupt: writing the checkpoint failed"; exit 1; }
python3 - "$dir/ck/step-00000004/rank-00001.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(5000)
    b = f.read(1)
    f.seek(5000)
    f.write(bytes([b[0] ^ 0x55]))
PY
"$expect" 2 2 "CRC32C mismatch in $dir/ck/step-00000004/rank-00001.bin" 60 "$mpiexec" "${flags[@]}" -- \
    "$bin" "${args[@]}" --train.steps=8 --checkpoint.resume=auto
