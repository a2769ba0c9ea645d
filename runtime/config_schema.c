/* The one place that declares every configuration key: type, default, range or choices, and a
 * one-line description. `meshtrain config --help` prints this table; docs/config.md mirrors it.
 * Keys are added here by the module that reads them.
 * SPDX-License-Identifier: MIT */
#include <float.h>

#include "blas.h"
#include "matmul.h"
#include "config.h"

#define I(k, d, lo, hi, h) {k, MT_CFG_INT, d, lo, hi, NULL, h}
#define F(k, d, lo, hi, h) {k, MT_CFG_FLOAT, d, lo, hi, NULL, h}
#define B(k, d, h) {k, MT_CFG_BOOL, d, 0, 1, NULL, h}
#define S(k, d, ch, h) {k, MT_CFG_STRING, d, 0, 0, ch, h}
#define BIG 9.0e15

static const mt_cfg_schema_t schema[] = {
    /* [model] */
    S("model.kind", "gpt2", "gpt2|mlp", "model family"),
    I("model.n_layer", "4", 1, 1024, "transformer blocks (gpt2) or hidden layers (mlp)"),
    I("model.n_head", "4", 1, 1024, "attention heads (gpt2)"),
    I("model.n_embd", "128", 1, 65536, "width: embedding size (gpt2) or hidden width (mlp)"),
    I("model.seq_len", "64", 1, 1 << 20, "context length T"),
    I("model.vocab_size", "256", 2, 1 << 24, "vocabulary size (gpt2); input/output size (mlp)"),
    I("model.padded_vocab", "0", 0, 1 << 24, "padded vocabulary for efficiency; 0 = round up to a multiple of 128"),
    S("model.recompute", "none", "none|block", "activation checkpointing: a block keeps only its input"),
    B("model.attn_recompute", "false", "attention does not keep the TxT probabilities; recomputed in backward"),
    I("model.head_chunks", "1", 1, 65536,
      "the head's logits in this many row chunks, recomputed in backward (1: whole, kept)"),
    S("model.init", "random", NULL, "\"random\" (GPT-2 initialisation from train.seed) or \"llmc:PATH\""),
    /* [data] */
    S("data.kind", "synthetic", "synthetic|shards", "synthetic generator or llm.c token shards"),
    S("data.train", "", NULL, "glob of llm.c token shards for training (data.kind = shards)"),
    S("data.val", "", NULL, "glob of llm.c token shards for validation (empty: no validation)"),
    S("data.order", "random", "random|sequential", "random batches from (seed, step), or contiguous windows"),
    /* [train] */
    I("train.steps", "50", 0, BIG, "optimizer steps to run"),
    I("train.global_batch", "8", 1, BIG, "sequences per optimizer step, over all data-parallel ranks"),
    I("train.micro_batch", "0", 0, BIG, "sequences per micro-batch per rank; 0 = global_batch / dp"),
    I("train.grad_accum", "0", 0, BIG, "micro-batches per step; 0 = global_batch / (micro_batch x dp)"),
    I("train.eval_every", "0", 0, BIG, "validation loss every N steps; 0 = never"),
    I("train.eval_batches", "4", 1, BIG, "batches of validation per evaluation"),
    I("train.log_every", "1", 1, BIG, "progress line every N steps"),
    I("train.seed", "1234", 0, BIG, "seed of initialisation and data order"),
    S("train.on_nan", "stop", "stop|skip", "what to do on a non-finite loss or gradient"),
    /* [optimizer] */
    S("optimizer.kind", "adamw", "adamw|sgd", "optimizer"),
    F("optimizer.lr", "1e-3", 0, 1e3, "peak learning rate"),
    F("optimizer.beta1", "0.9", 0, 0.999999, "AdamW first-moment decay"),
    F("optimizer.beta2", "0.95", 0, 0.999999999, "AdamW second-moment decay"),
    F("optimizer.eps", "1e-8", 0, 1, "AdamW epsilon"),
    F("optimizer.weight_decay", "0.0", 0, 10, "decoupled weight decay (2-D weights only)"),
    F("optimizer.momentum", "0.0", 0, 0.999999, "SGD momentum"),
    F("optimizer.grad_clip", "1.0", 0, 1e9, "clip gradients to this global norm; 0 = off"),
    S("optimizer.schedule", "cosine", "constant|cosine", "learning-rate schedule"),
    I("optimizer.warmup_steps", "0", 0, BIG, "linear warm-up steps"),
    F("optimizer.min_lr", "0.0", 0, 1e3, "final learning rate of the cosine schedule"),
    /* [parallel] */
    I("parallel.tp", "1", 1, 1 << 20, "tensor-parallel ranks"),
    I("parallel.pp", "1", 1, 1 << 20, "pipeline stages"),
    I("parallel.dp", "0", 0, 1 << 30, "data-parallel ranks; 0 = world / (tp x pp)"),
    S("parallel.order", "tp-dp-pp", NULL, "mesh order, fastest-varying axis first, or \"auto\""),
    S("parallel.engine", "ddp", "dp|ddp|zero", "data-parallel engine"),
    I("parallel.zero_stage", "1", 1, 3, "ZeRO stage when engine = zero"),
    F("parallel.bucket_mb", "25", 0.001, 1e6, "DDP / ZeRO gradient bucket size in MiB"),
    I("parallel.zero_persist_threshold", "0", 0, BIG, "ZeRO-3: parameters below this many elements stay whole"),
    S("parallel.schedule", "1f1b", "gpipe|1f1b", "pipeline schedule"),
    I("parallel.microbatches", "0", 0, BIG, "pipeline micro-batches; 0 = derived, else must agree"),
    S("parallel.stage_layers", "", NULL, "blocks per pipeline stage, e.g. \"3,3,2,2\"; empty = balanced"),
    B("parallel.sequence_parallel", "false", "split LayerNorm/residual regions along the sequence over tp"),
    I("parallel.tp_comm_chunks", "1", 1, 64,
      "GPU tp: row-parallel reductions and sp gathers in row chunks overlapping their products"),
    S("parallel.dp_reduce", "auto", "auto|engine|allreduce",
      "tp/pp jobs: dp gradients by parallel.engine, one all-reduce, or auto"),
    /* [precision] */
    S("precision.compute", "fp32", "fp32|tf32|bf16|fp16", "compute precision (CPU: tf32 = fp32, bf16/fp16 emulated)"),
    F("precision.init_scale", "65536", 1, 1e38, "fp16: initial loss scale"),
    I("precision.scale_window", "1000", 1, BIG, "fp16: clean steps before the loss scale doubles"),
    /* [checkpoint] */
    S("checkpoint.dir", "", NULL, "checkpoint directory; empty = no checkpoints"),
    I("checkpoint.every", "0", 0, BIG, "write a checkpoint every N steps; 0 = only at the end"),
    I("checkpoint.keep", "2", 1, BIG, "checkpoints kept"),
    S("checkpoint.resume", "auto", NULL, "\"auto\" (latest in dir), \"none\", or a checkpoint path"),
    B("checkpoint.on_signal", "true", "write a checkpoint on SIGTERM/SIGINT before exiting"),
    /* [metrics] */
    S("metrics.jsonl", "", NULL, "write one JSON object per step to this file (rank 0)"),
    B("metrics.per_rank", "false", "also write one metrics file per rank"),
    /* [profile] */
    S("profile.trace", "", NULL, "Chrome trace-event JSON output path"),
    S("profile.steps", "", NULL, "steps to trace, \"A-B\""),
    S("profile.memory", "", NULL, "allocator history output path"),
    /* [runtime] */
    S("runtime.bind", "auto", "auto|force|none", "CPU binding: keep the launcher's, force ours, or none"),
    S("runtime.blas_core", "auto", MT_BLAS_CORE_CHOICES,
      "OpenBLAS kernel: auto = the best this CPU runs when OpenBLAS chose a weaker one and OPENBLAS_CORETYPE / "
      "OPENBLAS_L2_SIZE are unset; keep = OpenBLAS's choice; or a kernel by name (an error if the CPU cannot run it)"),
    S("runtime.matmul", "auto", MT_MATMUL_CHOICES,
      "CPU matrix products: auto = on oneDNN where it has a native kernel (bf16 ones where the CPU has AMX or "
      "AVX512-BF16, else emulated), else OpenBLAS; openblas = every product on OpenBLAS (bf16 emulated); onednn = "
      "every product on oneDNN"),
    S("runtime.cpu_kernels", "auto", "auto|baseline",
      "CPU kernels (attention, layernorm, GELU, softmax): auto = the AVX-512 build where the CPU has it; baseline = "
      "the x86-64 baseline build everywhere"),
    S("runtime.nic", "none", "none|auto", "export the nearest NIC for NCCL"),
    S("runtime.device", "auto", "auto|cpu|cuda", "where to compute"),
    S("runtime.gpu_comm", "auto", "auto|nccl|mpi",
      "GPU engine's communication: NCCL, or MPI through pinned host memory (ranks may share a GPU); auto = NCCL "
      "unless ranks share a GPU"),
    F("runtime.watchdog_s", "600", 0.1, 1e7, "seconds before a pending collective is reported and the job aborted"),
};

const mt_cfg_schema_t *mt_config_schema(size_t *n) {
    *n = MT_ARRAY_LEN(schema);
    return schema;
}
