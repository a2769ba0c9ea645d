#!/usr/bin/env python3
# The PyTorch half of bench/bench_vs_pytorch.sh: times the same GPT-2 training step as
# `meshtrain train` (n_layer 4, n_embd 256, n_head 4, seq 256, batch 8, vocabulary 4096; forward,
# cross-entropy, backward, gradient clipping at 1.0, AdamW lr 3e-4 betas (0.9, 0.95) eps 1e-8 no weight
# decay) on random tokens, with transformers' GPT2LMHeadModel and sdpa attention. fp32 is plain fp32;
# bf16 is torch.autocast("cpu", bfloat16) around forward + loss with fp32 master weights. Warms up, times
# N steps and prints one machine-readable line per precision:
#   pytorch fp32 tok/s 6500.0 step_ms 315.1 loss 8.31 attn sdpa threads 2 steps 10
#   usage: bench/pytorch_gpt2_step.py [--precision fp32,bf16] [--steps N] [--warmup 3] [--threads T]
# SPDX-License-Identifier: MIT
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

N_LAYER, N_EMBD, N_HEAD, SEQ, BATCH, VOCAB = 4, 256, 4, 256, 8, 4096
ATTN = "sdpa"  # transformers' fastest built-in attention for GPT-2 on CPU (the other is "eager")


def run(precision, steps, warmup, seed):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_HEAD, n_positions=SEQ,
                        vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        activation_function="gelu_new",
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)  # GPT-2's 50256 is past VOCAB
    config._attn_implementation = ATTN
    model = GPT2LMHeadModel(config)
    model.train()
    attn = getattr(model.config, "_attn_implementation", "unknown")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    # Synthetic data: uniform random tokens, made up front so that no step times their generation.
    # Each row holds SEQ + 1 tokens: SEQ inputs and their SEQ next-token targets, as in meshtrain.
    data = torch.randint(0, VOCAB, (warmup + steps, BATCH, SEQ + 1))
    use_bf16 = precision == "bf16"

    def step(batch):
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    times = []
    loss = float("nan")
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = step(data[i])
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    med = statistics.median(times)
    return BATCH * SEQ / med, med * 1e3, loss, attn


def main():
    ap = argparse.ArgumentParser(
        description="Time a GPT-2 training step in PyTorch (see bench/bench_vs_pytorch.sh).")
    ap.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    torch.set_num_threads(a.threads)
    print(f"pytorch versions torch {torch.__version__} transformers {transformers.__version__} "
          f"threads {torch.get_num_threads()}", flush=True)
    for p in a.precision.split(","):
        if p not in ("fp32", "bf16"):
            ap.error(f"unknown precision {p!r}")
        tok_s, step_ms, loss, attn = run(p, a.steps, a.warmup, a.seed)
        print(f"pytorch {p} tok/s {tok_s:.1f} step_ms {step_ms:.1f} loss {loss:.6f} attn {attn} "
              f"threads {torch.get_num_threads()} steps {a.steps}", flush=True)


if __name__ == "__main__":
    main()
