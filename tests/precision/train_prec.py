#!/usr/bin/env python3
# Mixed precision through `meshtrain train` (the training loop, every engine): per-step losses of bf16 and
# fp16 against fp32, the fp16 loss scaler's skip-and-halve on an overflow, and resuming an fp16 run bit for
# bit. Tolerances, measured on this tiny GPT-2 (2 layers x 32 wide, vocabulary 64, 8 steps of 8 x 16
# tokens, AdamW lr 3e-3) in every layout the tests run (1 rank; DDP on 2 and 4; ZeRO-3, tp 2 x dp 2,
# pp 2 x dp 2 on 4), each bound about 5x the largest measured deviation:
#   BF16_TOL  max over steps of |loss - loss_fp32| / (1 + loss_fp32) for bf16 (8-bit mantissa weights,
#             activations and gradients): measured 3.9e-5 in every layout.
#   FP16_TOL  the same for fp16 (11-bit mantissa, loss scale 1024): measured 1.3e-5 .. 1.35e-5 (tp).
#   DP_TOL    fp16 on 1 rank against fp16 under DDP on 2 / 4 ranks: measured 0 (the engines reduce in a
#             fixed order and every micro-batch has 2 sequences in both); the bound leaves room for a
#             reduction order that changes the last bits.
# Every low-precision run must also differ from fp32 at some step (the rounding happens), and tf32 must
# equal fp32 exactly (on the CPU tf32 is fp32 arithmetic).
#   train_prec.py MODE NP MESHTRAIN [MPIEXEC [FLAGS...]] [-- EXTRA_ARGS...]
#   MODE: equiv (every mode against fp32 in the layout EXTRA_ARGS gives; with NP > 1 and data parallelism
#   only, also fp16 against a 1-rank fp16 run), overflow (fp16 gradients of one rank overflow in backward
#   at step 3: MESHTRAIN_TEST_OVERFLOW_STEP), nanknob (the same checks with a NaN written into the
#   finished gradient: MESHTRAIN_TEST_NAN_STEP; one rank, the local engine: under the parallel engines
#   that knob writes into a buffer the engine does not reduce or reuse), resume (fp16 stopped, resumed).
# SPDX-License-Identifier: MIT
import json
import os
import subprocess
import sys
import tempfile

BF16_TOL = 2e-4
FP16_TOL = 7e-5
DP_TOL = 1e-5

mode, np_ = sys.argv[1], int(sys.argv[2])
rest = sys.argv[3:]
extra = []
if "--" in rest:
    extra = rest[rest.index("--") + 1:]
    rest = rest[:rest.index("--")]
binary, launcher = rest[0], rest[1:]
BASE = ["train", "--parallel.tp=1", "--parallel.pp=1", "--model.n_layer=2", "--model.n_embd=32", "--model.n_head=2", "--model.seq_len=16",
        "--model.vocab_size=64", "--train.global_batch=8", "--train.micro_batch=2", "--train.eval_every=0",
        "--train.log_every=1", "--optimizer.warmup_steps=2", "--checkpoint.dir=", "--profile.trace=",
        "--profile.memory=", "--precision.init_scale=1024"]
failures = []


def fail(msg):
    print("FAIL: " + msg)
    failures.append(msg)


def run(np, args, env_extra=None, expect_rc=0):
    cmd = ([binary] if np == 0 else launcher[:1] + ["-n", str(np)] + launcher[1:] + [binary]) + BASE + args
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=120)
    out = p.stdout.decode(errors="replace")
    if p.returncode != expect_rc:
        print(out[-4000:])
        raise SystemExit("FAIL: %s exited %d (expected %d)" % (" ".join(cmd), p.returncode, expect_rc))
    return out


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(tmp, name, np, args, env_extra=None):
    path = os.path.join(tmp, name + ".jsonl")
    out = run(np, args + ["--metrics.jsonl=" + path], env_extra)
    return metrics(path), out


def rel_dev(a, b):
    return max(abs(x["loss"] - y["loss"]) / (1.0 + abs(y["loss"])) for x, y in zip(a, b))


def equiv(tmp):
    np = np_ if np_ > 1 else 0
    steps = ["--train.steps=8"]
    runs = {}
    for p in ("fp32", "tf32", "bf16", "fp16"):
        runs[p], _ = train(tmp, p, np, steps + ["--precision.compute=" + p] + extra)
        if len(runs[p]) != 8:
            fail("%s: %d steps in the metrics" % (p, len(runs[p])))
    ref = runs["fp32"]
    if [m["loss"] for m in runs["tf32"]] != [m["loss"] for m in ref]:
        fail("tf32 on the CPU differs from fp32")
    for p, tol in (("bf16", BF16_TOL), ("fp16", FP16_TOL)):
        d = rel_dev(runs[p], ref)
        print("%s vs fp32 (np %d %s): max |dloss|/(1+loss) = %.3g (tolerance %.3g)" % (p, np_, " ".join(extra), d, tol))
        if not d <= tol:
            fail("%s deviates from fp32 by %.3g > %.3g" % (p, d, tol))
        if d == 0.0:
            fail("%s equals fp32 exactly: no rounding happened" % p)
        if any(m["skipped"] for m in runs[p]):
            fail("%s skipped a step" % p)
    if any(m["loss_scale"] != 1024 for m in runs["fp16"]) or any(m["loss_scale"] != 1 for m in runs["bf16"]):
        fail("loss_scale: fp16 should stay 1024 (window 1000), bf16 1")
    if np_ > 1 and not extra_has("--parallel.tp") and not extra_has("--parallel.pp"):
        one, _ = train(tmp, "fp16_np1", 0, steps + ["--precision.compute=fp16"])
        d = rel_dev(runs["fp16"], one)
        print("fp16 np %d vs fp16 np 1: max |dloss|/(1+loss) = %.3g (tolerance %.3g)" % (np_, d, DP_TOL))
        if not d <= DP_TOL:
            fail("fp16 on %d ranks deviates from 1 rank by %.3g > %.3g" % (np_, d, DP_TOL))


def extra_has(key):
    return any(a.startswith(key + "=") and not a.endswith("=1") for a in extra)


def shard_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".bin"))


def overflow(tmp):
    np = np_ if np_ > 1 else 0
    ck = os.path.join(tmp, "ck")
    # one rank only, and every rank must still agree: the last one, or under tensor parallelism tp rank 0 of
    # the last dp rank (a tp group shares one loss scale; the knob is meant for a whole group's overflow)
    tp = int(next((a.split("=")[1] for a in extra if a.startswith("--parallel.tp=")), "1"))
    rank = str(max(np_ - tp, 0))
    if mode == "overflow":  # a real f16 overflow inside one rank's backward, through the engine's communication
        env = {"MESHTRAIN_TEST_OVERFLOW_STEP": "3", "MESHTRAIN_TEST_OVERFLOW_RANK": rank}
    else:  # the on_nan knob: a NaN written into one rank's gradient after the engine finished them
        env = {"MESHTRAIN_TEST_NAN_STEP": "3", "MESHTRAIN_TEST_NAN_RANK": rank}
    path = os.path.join(tmp, "m.jsonl")
    args = ["--train.steps=6", "--precision.compute=fp16", "--checkpoint.dir=" + ck, "--checkpoint.every=1",
            "--checkpoint.keep=10", "--metrics.jsonl=" + path, "--metrics.per_rank=true"] + extra
    out = run(np, args, env)
    ms = metrics(path)
    per_rank = [metrics(os.path.join(tmp, "m.rank%d.jsonl" % r)) for r in range(max(np_, 1))]
    if "update skipped, loss scale now 512" not in out or "fp16 gradients overflowed at loss scale 1024" not in out:
        print(out[-3000:])
        fail("no overflow message in the output")
    if len(ms) != 6:
        fail("training did not continue: %d steps" % len(ms))
    skipped = [m["step"] for m in ms if m["skipped"]]
    scales = [m["loss_scale"] for m in ms]
    print("np %d: skipped steps %s, loss scales %s" % (np_, skipped, scales))
    if skipped != [3] or scales != [1024, 1024, 1024, 512, 512, 512]:
        fail("expected step 3 skipped and the scale 1024 -> 512 after it")
    if ms[2]["grad_norm"] is not None:
        fail("the overflowed step's gradient norm should be non-finite (null): %s" % ms[2]["grad_norm"])
    if any(m["loss"] is None for m in ms) or ms[-1]["loss"] >= ms[0]["loss"]:
        fail("training after the overflow: losses %s" % [m["loss"] for m in ms])
    for r, pr in enumerate(per_rank):
        got = [(m["skipped"], m["loss_scale"]) for m in pr]
        if got != [(m["skipped"], m["loss_scale"]) for m in ms]:
            fail("rank %d saw another skip/scale sequence: %s" % (r, got))
    # the skipped step changed nothing: parameters and optimizer state of step 3 equal step 2's, byte for byte
    s2, s3, s4 = (os.path.join(ck, "step-%08d" % s) for s in (2, 3, 4))
    files = shard_files(s2)
    if not files or files != shard_files(s3):
        fail("checkpoint shard files of steps 2 and 3: %s vs %s" % (files, shard_files(s3)))
    for f in files:
        a, b = (open(os.path.join(d, f), "rb").read() for d in (s2, s3))
        if a != b:
            fail("%s changed across the skipped step 3" % f)
    a, c = (b"".join(open(os.path.join(d, f), "rb").read() for f in files) for d in (s2, s4))
    if a == c:
        fail("no shard changed at step 4: training stopped updating")
    with open(os.path.join(s3, "manifest.json")) as f:
        p = json.load(f)["precision"]
    if p != {"compute": "fp16", "loss_scale": 512, "clean_steps": 0}:
        fail("manifest precision after step 3: %s" % p)


def resume(tmp):
    np = np_ if np_ > 1 else 0
    common = ["--train.steps=10", "--precision.compute=fp16", "--precision.scale_window=2",
              "--precision.init_scale=16384", "--checkpoint.every=1", "--checkpoint.keep=20"] + extra
    ck1, ck2 = os.path.join(tmp, "ck1"), os.path.join(tmp, "ck2")
    full, _ = train(tmp, "full", np, common + ["--checkpoint.dir=" + ck1])
    part, out = train(tmp, "part", np, common + ["--checkpoint.dir=" + ck2,
                                                 "--checkpoint.resume=" + os.path.join(ck1, "step-00000005")])
    if "resumed from checkpoint" not in out:
        fail("the second run did not resume")
    scales = [m["loss_scale"] for m in full]
    print("np %d: scales of the uninterrupted run %s, skipped %s" % (np_, scales, [m["step"] for m in full if m["skipped"]]))
    if len(set(scales[5:])) < 2 and len(set(scales)) < 3:
        fail("the scale did not move around the resume point: the test would not see a lost scaler state")
    key = lambda m: (m["step"], m["loss"], m["grad_norm"], m["loss_scale"], m["skipped"])
    a, b = [key(m) for m in full[5:]], [key(m) for m in part]
    if a != b:
        fail("resumed run differs from the uninterrupted one:\n  %s\n  %s" % (a, b))
    for f in shard_files(os.path.join(ck1, "step-00000010")):
        if open(os.path.join(ck1, "step-00000010", f), "rb").read() != \
                open(os.path.join(ck2, "step-00000010", f), "rb").read():
            fail("final checkpoint %s differs between the runs" % f)


with tempfile.TemporaryDirectory() as tmp:
    {"equiv": equiv, "overflow": overflow, "nanknob": overflow, "resume": resume}[mode](tmp)
print("train_prec %s np %d: %s" % (mode, np_, "FAILED" if failures else "ok"))
sys.exit(1 if failures else 0)
