/* Memory and communication accounting of the data-parallel engines against the ZeRO paper's model.
 * On a 3.3M-parameter GPT-2 with AdamW (f32: parameters, gradients, m, v = 16 bytes per parameter), the
 * per-rank model-state bytes the allocator reports (params + grads + optimizer categories) must be
 *   DDP 16Ψ,  ZeRO-1 8Ψ + 8Ψ/N,  ZeRO-2 4Ψ + 12Ψ/N,  ZeRO-3 16Ψ/N,  (DP: root 16Ψ, others 8Ψ)
 * within the stated overhead: the padding (every unit rounded up to N*16 elements: Ψp - Ψ <= units*N*16)
 * times its bytes per element, plus 64-byte allocation rounding of each buffer and optimizer tensor;
 * that overhead must itself be under 0.5% of the figure. Communication buffers (category comm) are
 * bounded separately: none for DDP/ZeRO-1 (in place), ZeRO-2 at most (units one module writes + tied
 * units) bucket buffers, ZeRO-3 that many plus 2x (units one module reads) gathered buffers, each at
 * most the largest unit. The bytes sent per rank per step must equal the formulas of engine.h exactly:
 * DDP 2Ψ(N-1)/N, ZeRO-1/2 2Ψp(N-1)/N, ZeRO-3 (3Ψp + 2 L_wte)(N-1)/N elements (GPT-2's tied wte is
 * gathered again for the head), DP 2Ψ(N-1)/N plus the batch its root scatters; and with 2 micro-batches
 * ZeRO-2 (2+1)Ψp, ZeRO-3 2*3Ψp (an MLP: nothing tied), DDP and ZeRO-1 unchanged.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "driver.h"
#include "runtime/rt.h"
#include "testutil.h"

static int64_t delta(const drv_result_t *r, mt_mem_cat_t c) {
    return r->mem_end.current[c] - r->mem_base.current[c];
}

static void gpt2_small(drv_cfg_t *c, int N) {
    drv_cfg_gpt2_tiny(c);
    c->model.n_layer = 4;
    c->model.n_head = 4;
    c->model.n_embd = 256;
    c->model.vocab_size = 512;
    c->model.seq_len = 32;
    c->seq_len = 32;
    c->global_batch = N;
    c->grad_accum = 1;
    c->steps = 1;
    c->optim.kind = MT_OPTIM_ADAMW;
}

static void check_memory(const char *what, mt_engine_kind_t kind, int stage, const drv_result_t *r, int N, int rank,
                         int n_params) {
    double psi = (double)r->mem.numel, pad = (double)(r->mem.numel_padded - r->mem.numel);
    int64_t params = delta(r, MT_MEM_PARAMS), grads = delta(r, MT_MEM_GRADS), opt = delta(r, MT_MEM_OPTIMIZER);
    int64_t comm = r->mem.comm, state = params + grads + opt;
    /* The collectives keep a little bookkeeping of their own under comm (DP's point-to-point group). */
    CHECK(delta(r, MT_MEM_COMM) >= comm && delta(r, MT_MEM_COMM) - comm <= 4096,
          "%s: comm bytes: allocator delta %lld, engine %lld", what, (long long)delta(r, MT_MEM_COMM), (long long)comm);
    CHECK(params == r->mem.params && grads == r->mem.grads && opt == r->mem.optimizer,
          "%s: allocator deltas (%lld %lld %lld) differ from the engine's own figures (%lld %lld %lld)", what,
          (long long)params, (long long)grads, (long long)opt, (long long)r->mem.params, (long long)r->mem.grads,
          (long long)r->mem.optimizer);
    double expect = 0.0, per_pad = 0.0;
    if (kind == MT_ENGINE_DP) {
        expect = rank == 0 ? 16 * psi : 8 * psi;
        per_pad = rank == 0 ? 16 : 8;
    } else if (kind == MT_ENGINE_DDP) {
        expect = 16 * psi;
        per_pad = 16;
    } else if (stage == 1) {
        expect = 8 * psi + 8 * psi / N;
        per_pad = 8 + 8.0 / N;
    } else if (stage == 2) {
        expect = 4 * psi + 12 * psi / N;
        per_pad = 4 + 12.0 / N;
    } else {
        expect = 16 * psi / N;
        per_pad = 16.0 / N;
    }
    double pad_bound = (double)r->mem.n_units * (kind == MT_ENGINE_ZERO ? N : 1) * 16;
    CHECK(pad <= pad_bound, "%s: padding %.0f elements exceeds units x N x 16 = %.0f", what, pad, pad_bound);
    double overhead = per_pad * pad + 64.0 * 4 + 128.0 * (n_params + r->mem.n_units);
    CHECK(fabs((double)state - expect) <= overhead,
          "%s: model state %lld bytes, theory %.0f (Ψ = %.0f, N = %d), allowed overhead %.0f", what, (long long)state,
          expect, psi, N, overhead);
    CHECK(overhead <= 0.005 * expect, "%s: the stated overhead %.0f is not small against %.0f", what, overhead, expect);
    int64_t unit_bytes = r->mem.max_unit * 4 + 64;
    int grad_bound = r->mem.max_module_units + r->mem.n_tied_units, param_bound = 2 * r->mem.max_module_units;
    if (stage < 2) {
        CHECK(comm == 0, "%s: %lld bytes of communication buffers; expected none (in place)", what, (long long)comm);
    } else {
        CHECK(r->mem.grad_buffers <= grad_bound, "%s: %d bucket buffers, bound %d", what, r->mem.grad_buffers,
              grad_bound);
        CHECK(stage == 3 || r->mem.param_buffers == 0, "%s: ZeRO-2 gathers nothing", what);
        CHECK(r->mem.param_buffers <= param_bound, "%s: %d gathered buffers, bound %d", what, r->mem.param_buffers,
              param_bound);
        CHECK(comm <= (int64_t)(r->mem.grad_buffers + r->mem.param_buffers) * unit_bytes,
              "%s: %lld comm bytes in %d + %d buffers of at most %lld", what, (long long)comm, r->mem.grad_buffers,
              r->mem.param_buffers, (long long)unit_bytes);
    }
    if (rank == 0) {
        printf("%-8s N=%d: Ψ %.0f, state %.2f MB (theory %.2f MB, %.3f x 16Ψ), comm buffers %.2f MB (%d+%d of <= %.2f "
               "MB)\n",
               what, N, psi, state / 1e6, expect / 1e6, state / (16 * psi), comm / 1e6, r->mem.grad_buffers,
               r->mem.param_buffers, unit_bytes / 1e6);
    }
}

static void check_bytes(const char *what, double got, double expect) {
    CHECK(fabs(got - expect) <= 1e-9 * expect + 1e-9, "%s: %.1f bytes sent per rank, formula %.1f", what, got, expect);
}

static void run(mt_comm_t dp, const char *name, mt_engine_kind_t kind, int stage) {
    int N = mt_comm_size(dp), rank = mt_comm_rank(dp);
    drv_cfg_t c;
    gpt2_small(&c, N);
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&c.model, &m));
    int n_params = mt_model_n_params(m);
    double wte = (double)mt_model_param(m, mt_model_find_param(m, "wte"))->numel;
    mt_model_free(m);
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = kind;
    ep.zero_stage = stage ? stage : 1;
    ep.bucket_mb = 1.0;
    ep.first_bucket_mb = 0.25;
    drv_result_t r;
    mt_status_t st = drv_run_engine(&c, dp, &ep, &r);
    CHECK(st == MT_OK, "%s: %s (%s)", name, mt_status_str(st), mt_last_error_msg());
    if (st != MT_OK) {
        drv_result_free(&r);
        return;
    }
    check_memory(name, kind, stage, &r, N, rank, n_params);
    double f = 4.0 * (N - 1) / N, psi = (double)r.mem.numel, psip = (double)r.mem.numel_padded;
    double scalars = 2 * 2 * 8.0 * (N - 1) / N; /* the norm's and the loss's f64 all-reduces */
    const mt_engine_comm_stats_t *cs = &r.comm[0];
    if (kind == MT_ENGINE_DP) {
        check_bytes(name, cs->bytes_model, 2 * psi * f);
        double batch = rank == 0 ? 2.0 * (N - 1) * (double)(c.global_batch / N) * c.seq_len * 4 : 0.0;
        check_bytes(name, cs->bytes_other, scalars + batch);
    } else if (kind == MT_ENGINE_DDP) {
        check_bytes(name, cs->bytes_model, 2 * psi * f);
    } else if (stage < 3) {
        check_bytes(name, cs->bytes_model, 2 * psip * f);
    } else {
        double lwte = ceil(wte / (16.0 * N)) * 16.0 * N;
        check_bytes(name, cs->bytes_model, (3 * psip + 2 * lwte) * f);
    }
    if (kind != MT_ENGINE_DP) {
        check_bytes(name, cs->bytes_other, scalars);
    }
    if (rank == 0) {
        printf("%-8s N=%d: %.3f MB sent per rank per step = %.4f x 2Ψ(N-1)/N (%lld calls)\n", name, N,
               cs->bytes_model / 1e6, cs->bytes_model / (2 * psi * f), (long long)cs->n_calls);
    }
    drv_result_free(&r);
}

/* Two micro-batches on the tiny MLP: ZeRO-2/3 reduce-scatter every micro-batch, the others once. */
static void run_accum(mt_comm_t dp, const char *name, mt_engine_kind_t kind, int stage) {
    int N = mt_comm_size(dp);
    drv_cfg_t c;
    drv_cfg_mlp_tiny(&c);
    c.steps = 2;
    c.global_batch = 4 * N;
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = kind;
    ep.zero_stage = stage ? stage : 1;
    ep.bucket_mb = 0.004;
    ep.first_bucket_mb = 0.001;
    drv_result_t r;
    mt_status_t st = drv_run_engine(&c, dp, &ep, &r);
    CHECK(st == MT_OK, "%s: %s (%s)", name, mt_status_str(st), mt_last_error_msg());
    if (st == MT_OK) {
        double f = 4.0 * (N - 1) / N, psi = (double)r.mem.numel, psip = (double)r.mem.numel_padded;
        double expect = kind == MT_ENGINE_DDP ? 2 * psi : stage == 1 ? 2 * psip : stage == 2 ? 3 * psip : 6 * psip;
        for (int s = 0; s < c.steps; s++) {
            check_bytes(name, r.comm[s].bytes_model, expect * f);
        }
        CHECK(r.mem.n_units >= 3, "%s: the accumulation check wants several units, got %d", name, r.mem.n_units);
    }
    drv_result_free(&r);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_comm_t dp = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, NULL, &dp));
    if (dp) {
        run(dp, "dp", MT_ENGINE_DP, 0);
        run(dp, "ddp", MT_ENGINE_DDP, 0);
        run(dp, "zero-1", MT_ENGINE_ZERO, 1);
        run(dp, "zero-2", MT_ENGINE_ZERO, 2);
        run(dp, "zero-3", MT_ENGINE_ZERO, 3);
        run_accum(dp, "ddp ga2", MT_ENGINE_DDP, 0);
        run_accum(dp, "zero-1 ga2", MT_ENGINE_ZERO, 1);
        run_accum(dp, "zero-2 ga2", MT_ENGINE_ZERO, 2);
        run_accum(dp, "zero-3 ga2", MT_ENGINE_ZERO, 3);
    }
    CHECK_OK(mt_comm_free(dp));
    return mt_test_finish_mpi("test_parallel_accounting");
}
