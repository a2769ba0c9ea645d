#!/usr/bin/env python3
"""The engine record: what every CPU layout computes, step by step, kept so a rewrite of the engines can be
held to it (issue 38: "record the before first").

For each layout of layouts_cpu.txt, `meshtrain train` runs the base job below on that many ranks and its
metrics.jsonl gives, per step, the loss, the gradient norm, the validation loss (after steps 2 and 4) and the
communication bytes (model and other). `record` writes them, every float as metrics.jsonl prints it (%.17g: the
double exactly), to a TSV file whose header names the CPU and matrix kernel they came from; `check` runs one
layout again and compares:
  - on the CPU model the record was made on: every value bit-identical (the same function, evaluated in the same
    order: a change that reorders a sum shows here, which is the point);
  - on another CPU: within 1e-5 relative (glibc's and OpenBLAS's code paths can differ by CPU), and it says how
    many values were still bit-identical, so the report never claims more than it checked;
  - the communication bytes: equal everywhere (they are counts).
OpenBLAS runs its Haswell kernel (AVX2 + FMA; OPENBLAS_CORETYPE), one thread, so the products do not depend on
which kernel the library would pick for the CPU, every product runs on OpenBLAS (runtime.matmul = "openblas":
bf16 emulated, not oneDNN's bf16 where the CPU has it) and the model's kernels are their baseline build
(runtime.cpu_kernels = "baseline", not the AVX-512 one, whose sums run in other lanes); a CPU without AVX2 and FMA
skips (exit 77, "skipped").

usage: before.py record MESHTRAIN LAYOUTS OUT.tsv [MPIEXEC [FLAGS...]]
       before.py check  MESHTRAIN LAYOUTS RECORD.tsv NAME [MPIEXEC [FLAGS...]]
Re-recording is for a change that is meant to change the numbers (say so in its commit): run `record` on the
machine of the last record where possible (its header says which), and review the diff.
SPDX-License-Identifier: MIT"""
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launch", "configs", "demo.toml")
BASE = ["--train.steps=4", "--train.eval_every=2", "--train.eval_batches=2", "--train.log_every=1",
        "--optimizer.warmup_steps=1", "--checkpoint.every=0", "--profile.trace=", "--profile.memory=",
        "--runtime.bind=none", "--runtime.matmul=openblas", "--runtime.cpu_kernels=baseline"]
KERNEL = "Haswell"
TOL = 1e-5
SKIP = 77


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def layouts(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                out[line[0]] = (int(line[1]), line[2:])
    return out


def run(binary, np, overrides, launcher):
    """One layout: its rows [(step, loss, norm, val, comm_model, comm_other)] as strings, and the blas field."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OPENBLAS_CORETYPE=KERNEL,
               MESHTRAIN_PEAK_GFLOPS_PER_CORE="50", CUDA_VISIBLE_DEVICES="")
    env.pop("OPENBLAS_L2_SIZE", None)
    with tempfile.TemporaryDirectory(prefix="mt_before_") as d:
        metrics = os.path.join(d, "metrics.jsonl")
        args = [binary, "train", CONFIG] + BASE + ["--metrics.jsonl=" + metrics,
                                                   "--checkpoint.dir=" + os.path.join(d, "ckpt")] + overrides
        if np > 1:
            if not launcher:
                sys.exit(f"FAIL: a {np}-rank layout needs an MPIEXEC argument")
            args = launcher + ["-np", str(np)] + args
        p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        if p.returncode != 0:
            print(p.stdout)
            sys.exit(f"FAIL: {shlex.join(args)} exited {p.returncode}")
        rows, blas = [], None
        with open(metrics) as f:
            for line in f:
                r = json.loads(line, parse_float=str, parse_int=str)
                if "step" not in r:
                    continue
                cb = r.get("comm_bytes", {})
                rows.append((r["step"], r["loss"], r["grad_norm"], r.get("val_loss", "-"), cb.get("model", "-"),
                             cb.get("other", "-")))
                blas = r.get("blas", blas)
        if len(rows) != 4:
            print(p.stdout)
            sys.exit(f"FAIL: {len(rows)} steps in metrics.jsonl, the base job runs 4")
        return rows, blas


def need_kernel():
    if not {"avx2", "fma"} <= cpu_flags():
        print(f"skipped: this CPU has no AVX2 + FMA, which OpenBLAS's {KERNEL} kernel (the record's) needs")
        sys.exit(SKIP)


def record(binary, lay_path, out, launcher):
    need_kernel()
    lay = layouts(lay_path)
    lines, blas = [], None
    for name, (np, ov) in lay.items():
        rows, blas = run(binary, np, ov, launcher)
        lines += ["\t".join((name,) + r) for r in rows]
        print(f"{name}: {len(rows)} steps", flush=True)
    try:
        commit = subprocess.run(["git", "-C", os.path.dirname(CONFIG), "rev-parse", "--short", "HEAD"],
                                stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    with open(out, "w") as f:
        f.write("# meshtrain engine record (tests/engine/before.py record); every float %.17g, as metrics.jsonl\n")
        f.write(f"# commit\t{commit}\n# cpu\t{cpu_model()}\n# blas\t{blas}\n")
        f.write("# layout\tstep\tloss\tgrad_norm\tval_loss\tcomm_model\tcomm_other\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines)} steps of {len(lay)} layouts")


def check(binary, lay_path, rec_path, name, launcher):
    need_kernel()
    lay = layouts(lay_path)
    if name not in lay:
        sys.exit(f"FAIL: no layout {name} in {lay_path}")
    head, want = {}, []
    with open(rec_path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if line.startswith("# ") and len(parts) == 2:
                head[parts[0][2:]] = parts[1]
            elif not line.startswith("#") and parts[0] == name:
                want.append(tuple(parts[1:]))
    if not want:
        sys.exit(f"FAIL: {rec_path} has no record of layout {name}: run `before.py record` (see its header)")
    np, ov = lay[name]
    got, blas = run(binary, np, ov, launcher)
    same_cpu = head.get("cpu") == cpu_model() and head.get("blas") == blas
    cols = ("step", "loss", "grad_norm", "val_loss", "comm_model", "comm_other")
    bad = exact = n = 0
    worst = 0.0
    for w, g in zip(want, got):
        for i, (a, b) in enumerate(zip(w, g)):
            if i == 0 or (a == "-" and b == "-"):
                if a != b:
                    print(f"FAIL: step {w[0]} {cols[i]}: recorded {a}, now {b}")
                    bad += 1
                continue
            n += 1
            if a == b:
                exact += 1
                continue
            if i >= 4 or same_cpu or "-" in (a, b) or a == "null" or b == "null":
                print(f"FAIL: step {w[0]} {cols[i]}: recorded {a}, now {b}")
                bad += 1
                continue
            rel = abs(float(a) - float(b)) / max(abs(float(a)), 1e-30)
            worst = max(worst, rel)
            if rel > TOL:
                print(f"FAIL: step {w[0]} {cols[i]}: recorded {a}, now {b} (relative {rel:.2e} > {TOL})")
                bad += 1
    if len(want) != len(got):
        print(f"FAIL: {len(want)} steps recorded, {len(got)} now")
        bad += 1
    if same_cpu:
        print(f"{name}: {n} values against the record of commit {head.get('commit')}, this CPU's: "
              f"{exact} bit-identical (all required)")
    else:
        print(f"{name}: {n} values against the record of commit {head.get('commit')}, made on another CPU or "
              f"kernel ({head.get('cpu')}, {head.get('blas')}; here {cpu_model()}, {blas}): {exact} bit-identical, "
              f"the rest within {TOL} (largest {worst:.2e}); the byte counts equal")
    sys.exit(1 if bad else 0)


def main(argv):
    if len(argv) >= 4 and argv[1] == "record":
        record(argv[2], argv[3], argv[4], argv[5:])
    elif len(argv) >= 6 and argv[1] == "check":
        check(argv[2], argv[3], argv[4], argv[5], argv[6:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
