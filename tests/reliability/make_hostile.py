#!/usr/bin/env python3
"""Writes the hostile inputs of the reliability tests into DIR: malformed configs, llm.c token shards and
llm.c checkpoints, one defect each (bad magic, wrong version, truncated, absurd sizes, contradictions).
SPDX-License-Identifier: MIT"""
import os
import struct
import sys

d = sys.argv[1]
os.makedirs(d, exist_ok=True)
os.makedirs(os.path.join(d, "dir.toml"), exist_ok=True)
os.makedirs(os.path.join(d, "dir.bin"), exist_ok=True)


def put(name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def shard(toks, magic=20240520, ver=1, n=None):
    n = len(toks) if n is None else n
    return struct.pack("<256i", *([magic, ver, n] + [0] * 253)) + struct.pack("<%dH" % len(toks), *toks)


def llmc(L=1, H=1, C=8, T=8, V=32, Vp=32, magic=20240326, ver=3):
    hd = [magic, ver, T, V, L, H, C, Vp] + [0] * 248
    n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return struct.pack("<256i", *hd) + struct.pack("<%df" % n, *[0.001 * (i % 97) for i in range(n)])


put("syntax.toml", b"[model\nn_layer = 2\n")
put("garbage.toml", bytes(range(256)) * 4)
put("unsupported.toml", b"[model]\nn_layer = [1, 2]\n")
put("badvalue.toml", b"[train]\nsteps = \"many\"\n")
toks = [i % 50 for i in range(5000)]
put("shard_magic.bin", shard(toks, magic=1))
put("shard_version.bin", shard(toks, ver=2))
put("shard_truncated.bin", shard(toks)[:-100])
put("shard_token.bin", shard([60000] + toks))
put("shard_count.bin", shard(toks, n=0x7FFFFFFF))
put("shard_negative.bin", shard(toks, n=-1))
put("ckpt_magic.bin", llmc(magic=7))
put("ckpt_version.bin", llmc(ver=5))
put("ckpt_truncated.bin", llmc()[:-8])
put("ckpt_absurd.bin", struct.pack("<8i", 20240326, 3, 1 << 20, 1 << 24, 1024, 1024, 65536, 1 << 25) + b"\0" * 992)
put("ckpt_heads.bin", llmc(H=3))  # channels 8 not a multiple of 3 heads
put("ckpt_ok.bin", llmc())
