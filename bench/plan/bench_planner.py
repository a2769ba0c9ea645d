#!/usr/bin/env python3
"""The planner's timing validation on this machine (docs/PERFORMANCE.md, "Planner").

For each layout of bench/plan/gpt2-cpu.toml, run `meshtrain train` REPS times and compare the step time
with `meshtrain plan --cluster launch/clusters/cpu-dev.toml`'s prediction for that layout.

The machine is shared with other agents: interference only ever adds time, so each run is summarised by
its fastest step among steps 6-20 ("min") and, for comparison, its median step ("med"); a layout's figure
is the median over the REPS runs of each. Runs of different layouts are interleaved (round-robin over the
layouts, REPS rounds) so a burst of load does not fall on one layout only.

  bench/plan/bench_planner.py [--reps 5] [--multi | --multi-only] [--save FILE] [--load FILE] [--calibrate]

--save/--load keep the measurements (JSON) so predictions can be recomputed after a cluster-file change;
--calibrate prints the device.efficiency and efficiency_half_work that fit two layouts (micro-batch 1 and 16,
no recomputation; device.attention_efficiency comes from a profile, see launch/clusters/cpu-dev.toml); the
other ten layouts validate them. Run from the repository root after
building into build/.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

BIN = "./build/meshtrain"
JOB = "bench/plan/gpt2-cpu.toml"
CLUSTER = "launch/clusters/cpu-dev.toml"
ENV = dict(os.environ, OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

# (world, overrides); the first two are the calibration points
LAYOUTS = [
    (1, "--train.micro_batch=1"),
    (1, "--train.micro_batch=16"),
    (1, "--train.micro_batch=2"),
    (1, "--train.micro_batch=4"),
    (1, "--train.micro_batch=8"),
    (1, "--train.micro_batch=2 --model.attn_recompute=true"),
    (1, "--train.micro_batch=8 --model.attn_recompute=true"),
    (1, "--train.micro_batch=16 --model.attn_recompute=true"),
    (1, "--train.micro_batch=2 --model.recompute=block"),
    (1, "--train.micro_batch=8 --model.recompute=block"),
    (1, "--train.micro_batch=16 --model.recompute=block"),
    (1, "--train.micro_batch=16 --model.recompute=block --model.attn_recompute=true"),
]
MULTI = [  # need a build whose `meshtrain train` runs dp, tp and pp > 1
    (2, "--parallel.engine=ddp --train.micro_batch=8"),
    (2, "--parallel.engine=zero --parallel.zero_stage=1 --train.micro_batch=8"),
    (4, "--parallel.engine=ddp --train.micro_batch=4"),
    (2, "--parallel.tp=2 --train.micro_batch=16"),
    (2, "--parallel.pp=2 --train.micro_batch=4"),
]

STEP = re.compile(r"^step +(\d+)/\d+ \|.*\| ([0-9.]+) ms \|")


def run(world, ov):
    cmd = [BIN, "train", JOB, "--train.log_every=1"] + ov.split()
    if world > 1:
        cmd = ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none"] + cmd
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stdout[-2000:] + out.stderr[-2000:]))
    ms = [float(m.group(2)) for line in out.stdout.splitlines() if (m := STEP.match(line)) and int(m.group(1)) > 5]
    return min(ms), statistics.median(ms)


def layout_key(world, ov):
    want = dict(kv.lstrip("-").split("=", 1) for kv in ov.split())
    block = want.get("model.recompute") == "block"
    attn = want.get("model.attn_recompute") == "true"
    rc = {(False, False): "none", (False, True): "attn", (True, False): "block", (True, True): "block+attn"}[(block, attn)]
    tp, pp = int(want.get("parallel.tp", 1)), int(want.get("parallel.pp", 1))
    eng = want.get("parallel.engine", "ddp")
    if eng == "zero":
        eng = "zero-" + want.get("parallel.zero_stage", "1")
    if tp > 1 or pp > 1:
        eng = "allreduce"
    return dict(world=world, tp=tp, pp=pp, engine=eng, micro_batch=int(want["train.micro_batch"]), recompute=rc)


def predict(layouts):
    plans = {}
    pred = []
    for world, ov in layouts:
        if world not in plans:
            out = subprocess.run([BIN, "plan", JOB, "--cluster", CLUSTER, "--world", str(world), "--json", "--top",
                                  "100000"], env=ENV, capture_output=True, text=True, check=True)
            plans[world] = json.loads(out.stdout)["layouts"]
        k = layout_key(world, ov)
        hit = [l for l in plans[world] if l["tp"] == k["tp"] and l["pp"] == k["pp"] and l["engine"] == k["engine"]
               and l["micro_batch"] == k["micro_batch"] and l["recompute"] == k["recompute"]
               and not l["sequence_parallel"] and l["schedule"] == "1f1b"]
        if not hit:
            sys.exit("no prediction for %d | %s" % (world, ov))
        pred.append(hit[0]["time_ms"])
    return pred


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--multi", action="store_true")
    ap.add_argument("--multi-only", action="store_true", help="only the multi-rank layouts (no calibration points)")
    ap.add_argument("--save")
    ap.add_argument("--load")
    ap.add_argument("--calibrate", action="store_true")
    a = ap.parse_args()
    layouts = MULTI if a.multi_only else LAYOUTS + (MULTI if a.multi else [])
    if a.load:
        meas = json.load(open(a.load))
        layouts = [tuple(x) for x in meas["layouts"]]
    else:
        runs = {i: [] for i in range(len(layouts))}
        for r in range(a.reps):
            for i, (world, ov) in enumerate(layouts):
                runs[i].append(run(world, ov))
        meas = {"layouts": layouts, "runs": [runs[i] for i in range(len(layouts))],
                "load": open("/proc/loadavg").read().split()[:3]}
        if a.save:
            json.dump(meas, open(a.save, "w"), indent=1)
    mins = [statistics.median(x[0] for x in r) for r in meas["runs"]]
    meds = [statistics.median(x[1] for x in r) for r in meas["runs"]]
    if a.calibrate:
        # step = compute + rest; compute = tokens (Fmm + Fatt / a) / (peak e w / (w + h)), w = B*T*C*C
        # (docs/planning.md), a = device.attention_efficiency from the cluster file (measured from a profile).
        # Micro-batch 1 and 16 without recomputation fix h (their ratio), then e.
        L, C, T, V, tokens = 4, 128, 64, 512, 16 * 64
        fmm = 6 * (V * C + L * (12 * C * C + 13 * C) + 2 * C)
        fatt = 12 * L * C * T
        cfg = open(CLUSTER).read()
        peak = float(re.search(r"^peak_tflops_fp32 = ([0-9.e+-]+)", cfg, re.M).group(1)) * 1e12
        att = float(re.search(r"^attention_efficiency = ([0-9.e+-]+)", cfg, re.M).group(1))
        mt = float(re.search(r"^multithread_efficiency = ([0-9.e+-]+)", cfg, re.M).group(1))  # one rank: both cores
        pred = predict(layouts[:2])
        t1 = mins[0] - (pred[0]["step"] - pred[0]["compute"])
        t16 = mins[1] - (pred[1]["step"] - pred[1]["compute"])
        w1, w16 = 1 * T * C * C, 16 * T * C * C
        r = t1 / t16
        h = w1 * 16 * (r - 1) / (16 - r)  # r = 16 (w1 + h) / (16 w1 + h)
        e = tokens * (fmm + fatt / att) / (peak * mt * t16 * 1e-3 * w16 / (w16 + h))
        print("calibration: efficiency = %.3f, efficiency_half_work = %.0f (from micro-batch 1: %.1f ms, 16: %.1f ms; "
              "attention_efficiency %.2f)" % (e, h, mins[0], mins[1], att))
        return
    pred = predict(layouts)
    print("load average at the end of the measurements: %s" % " ".join(meas["load"]))
    print("%-74s %9s %9s %7s %9s %7s" % ("layout (world | overrides)", "pred. ms", "min ms", "error", "med ms",
                                          "error"))
    for i, (world, ov) in enumerate(layouts):
        p = pred[i]["step"]
        tag = " (calibration)" if i < 2 and layouts[0] == LAYOUTS[0] else ""
        print("%-74s %9.2f %9.2f %+6.1f%% %9.2f %+6.1f%%" % ("%d | %s%s" % (world, ov, tag), p, mins[i],
                                                            100 * (p - mins[i]) / mins[i], meds[i],
                                                            100 * (p - meds[i]) / meds[i]))
    val = range(2 if layouts[0] == LAYOUTS[0] else 0, len(layouts))
    within = sum(1 for i in val if abs(pred[i]["step"] - mins[i]) <= 0.25 * mins[i])
    print("validation layouts within 25%% (min): %d of %d" % (within, len(val)))
    bp = min(range(len(layouts)), key=lambda i: pred[i]["step"])
    bm = min(range(len(layouts)), key=lambda i: mins[i])
    print("predicted best: %d | %s (measured %.2f ms); measured best: %d | %s (%.2f ms): %+.1f%%" % (
        layouts[bp][0], layouts[bp][1], mins[bp], layouts[bm][0], layouts[bm][1], mins[bm],
        100 * (mins[bp] - mins[bm]) / mins[bm]))


if __name__ == "__main__":
    main()
