#!/bin/sh
# Fails if an executable built with the emulated NCCL (emu_nccl.cpp) leaves any NCCL call undefined, that is,
# to the real libnccl. Usage: no_nccl_left.sh EXE... Test-only.
# SPDX-License-Identifier: MIT
for f; do
    u=$(nm -u "$f") || { echo "nm failed on $f"; exit 2; }
    if echo "$u" | grep -w -E 'p?nccl[A-Za-z]+'; then
        echo "$f: the NCCL calls above are left to libnccl: emulate them in tests/gpu/emu/emu_nccl.cpp"
        exit 1
    fi
done
echo "no NCCL call left to libnccl in $# executable(s)"
