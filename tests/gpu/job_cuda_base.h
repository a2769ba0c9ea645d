/* The small GPT-2 job of the GPU engine's tests (test_job_cuda.c) and of its engine record
 * (tests/engine/record_gpu.c): 2 blocks of width 32, sequences of 16 over a vocabulary of 32, synthetic data,
 * 5 AdamW steps of 2 micro-batches of 2, warm-up 2 steps. Test-only.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TESTS_JOB_CUDA_BASE_H
#define MT_TESTS_JOB_CUDA_BASE_H

#define MT_JOB_CUDA_BASE_ARGS                                                                                          \
    "--model.kind=gpt2", "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.seq_len=16",           \
        "--model.vocab_size=32", "--data.kind=synthetic", "--train.micro_batch=2", "--train.grad_accum=2",             \
        "--train.log_every=1", "--optimizer.kind=adamw", "--optimizer.lr=1e-2", "--optimizer.warmup_steps=2",          \
        "--optimizer.weight_decay=0.1", "--train.steps=5", "--runtime.watchdog_s=120"

#endif
