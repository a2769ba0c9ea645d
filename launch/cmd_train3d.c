/* `meshtrain train3d [CONFIG.toml] [--section.key=value ...]`: trains the model the config describes with
 * tensor, pipeline and data parallelism (parallel.tp x parallel.pp x dp = world, parallel/parallel3d.h),
 * printing the same progress lines as `meshtrain train` on rank 0, so the two can be compared step by step.
 * Exit status: 0 trained, 2 bad input (config, refused combination, data files), 1 failure while running.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "job.h"
#include "models/data/data.h"
#include "parallel/parallel3d.h"
#include "runtime/config.h"
#include "runtime/rt.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: meshtrain train3d [CONFIG.toml] [--section.key=value ...]\n"
            "Trains with tensor parallelism (parallel.tp, parallel.sequence_parallel), a pipeline (parallel.pp,\n"
            "parallel.schedule = gpipe|1f1b, parallel.stage_layers) over the train.grad_accum micro-batches, and\n"
            "data parallelism over the remaining ranks: gradients averaged by parallel.engine (ddp, or zero with\n"
            "parallel.zero_stage) or by one all-reduce per step (parallel.dp_reduce = auto|engine|allreduce; auto\n"
            "uses the engine unless tp > 1, or pp > 1 with clipping). Clipping to optimizer.grad_clip, validation\n"
            "every train.eval_every steps, a progress line per train.log_every steps as `meshtrain train`.\n"
            "Without CONFIG it runs the embedded default job. Exit status: 0 done, 2 bad input, 1 failure.\n");
}

typedef struct {
    const mt_config_t *cfg;
    mt_par3d_t p3;
    mt_data_t train, val;
    mt_lr_sched_t sched;
    int rank, coords[MT_AXIS_N], tp, pp;
    int64_t global_batch, seq_len;
} run_t;

static mt_status_t open_data(run_t *r, bool val, int dp_rank, int dp, int64_t vocab, mt_data_t *out) {
    const mt_config_t *cfg = r->cfg;
    mt_data_params_t p = MT_DATA_PARAMS_INIT;
    if (!mt_data_kind_parse(mt_config_str(cfg, "data.kind"), &p.kind) ||
        !mt_data_order_parse(mt_config_str(cfg, "data.order"), &p.order)) {
        return mt_error(MT_ERR_INVALID_ARG, "data.kind / data.order: unknown value");
    }
    p.glob = mt_config_str(cfg, val ? "data.val" : "data.train");
    p.what = val ? "data.val" : "data.train";
    if (val) {
        p.order = MT_DATA_SEQUENTIAL; /* as `meshtrain train`: every evaluation reads the same windows */
    }
    p.seed = (uint64_t)mt_config_int(cfg, "train.seed");
    p.split = val ? 1 : 0;
    p.global_batch = r->global_batch;
    p.seq_len = r->seq_len;
    p.vocab_size = vocab;
    p.dp_rank = dp_rank;
    p.dp_size = dp;
    return mt_data_open(&p, out);
}

/* The parallel3d parameters from the parallel.*, train.* and optimizer.* keys. */
static mt_status_t params_from_config(const mt_config_t *cfg, const mt_model_config_t *mc, mt_par3d_params_t *p) {
    p->tp = (int)mt_config_int(cfg, "parallel.tp");
    p->pp = (int)mt_config_int(cfg, "parallel.pp");
    p->dp = (int)mt_config_int(cfg, "parallel.dp");
    const char *order = mt_config_str(cfg, "parallel.order");
    p->order = strcmp(order, "auto") ? order : NULL; /* auto: tp fastest, the default */
    if (!mt_pp_schedule_parse(mt_config_str(cfg, "parallel.schedule"), &p->schedule)) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.schedule = \"%s\": expected gpipe or 1f1b",
                        mt_config_str(cfg, "parallel.schedule"));
    }
    p->microbatches = (int)mt_config_int(cfg, "train.grad_accum");
    p->micro_batch = (int)mt_config_int(cfg, "train.micro_batch");
    p->seq_len = mc->seq_len;
    p->stage_layers = mt_config_str(cfg, "parallel.stage_layers");
    p->sequence_parallel = mt_config_bool(cfg, "parallel.sequence_parallel");
    const char *engine = mt_config_str(cfg, "parallel.engine"), *reduce = mt_config_str(cfg, "parallel.dp_reduce");
    if (!mt_engine_kind_parse(engine, &p->engine_kind)) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.engine = \"%s\": expected dp, ddp or zero", engine);
    }
    p->zero_stage = (int)mt_config_int(cfg, "parallel.zero_stage");
    p->bucket_mb = mt_config_float(cfg, "parallel.bucket_mb");
    p->grad_clip = (float)mt_config_float(cfg, "optimizer.grad_clip");
    p->skip_nonfinite = !strcmp(mt_config_str(cfg, "train.on_nan"), "skip");
    /* auto: the engine wherever parallel3d can run it (not tensor-parallel; no clipping across stages) */
    bool engine_ok = p->tp == 1 && (p->pp == 1 || p->grad_clip == 0.0f);
    if (!strcmp(reduce, "engine") || (!strcmp(reduce, "auto") && engine_ok)) {
        p->dp_mode = MT_P3D_ENGINE;
    } else {
        p->dp_mode = MT_P3D_ALLREDUCE;
    }
    mt_lr_sched_t unused;
    mt_job_optim_config(cfg, &p->optim, &unused);
    return MT_OK;
}

static mt_status_t setup(run_t *r, mt_par3d_params_t *p) {
    const mt_config_t *cfg = r->cfg;
    const char *prec = mt_config_str(cfg, "precision.compute");
    if (strcmp(prec, "fp32") != 0) {
        return mt_error(MT_ERR_INVALID_ARG, "precision.compute = \"%s\": train3d computes in fp32", prec);
    }
    if (strcmp(mt_config_str(cfg, "model.init"), "random") != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "model.init = \"%s\": train3d starts from the random initialisation "
                        "(set model.init = \"random\")",
                        mt_config_str(cfg, "model.init"));
    }
    mt_model_config_t mc;
    mt_job_model_config(cfg, &mc);
    MT_CHECK(params_from_config(cfg, &mc, p));
    r->global_batch = mt_config_int(cfg, "train.global_batch");
    r->seq_len = mc.seq_len;
    mt_optim_params_t unused;
    mt_job_optim_config(cfg, &unused, &r->sched);
    MT_CHECK(mt_par3d_init(mt_rt_world()->comm, &mc, p, &r->p3));
    mt_par3d_coords(r->p3, r->coords);
    int dp = mt_rt_world()->size / (p->tp * p->pp);
    MT_CHECK(open_data(r, false, r->coords[MT_AXIS_DP], dp, mc.vocab_size, &r->train));
    if (mt_config_int(cfg, "train.eval_every") > 0) {
        bool synthetic = !strcmp(mt_config_str(cfg, "data.kind"), "synthetic");
        if (synthetic || mt_config_str(cfg, "data.val")[0] != '\0') {
            MT_CHECK(open_data(r, true, r->coords[MT_AXIS_DP], dp, mc.vocab_size, &r->val));
        } else if (r->rank == 0) {
            printf("note: train.eval_every = %lld but data.val is empty: no validation\n",
                   (long long)mt_config_int(cfg, "train.eval_every"));
        }
    }
    if (r->rank == 0) {
        double n = 0;
        mt_model_t m = mt_par3d_model(r->p3);
        for (int i = 0; i < mt_model_n_params(m); i++) {
            const mt_param_t *q = mt_model_param(m, i);
            n += (double)q->global_shape[0] * (double)q->global_shape[1];
        }
        printf("meshtrain train3d: %s (n_layer %d, n_embd %d), %.3fM parameters | %lld steps of %lld x %lld tokens "
               "(micro-batch %d x %d) | %s lr %g %s | tp %d x pp %d (%s) x dp %d (%s)%s\n",
               mt_config_str(cfg, "model.kind"), mc.n_layer, mc.n_embd, n / 1e6,
               (long long)mt_config_int(cfg, "train.steps"), (long long)r->global_batch, (long long)r->seq_len,
               p->micro_batch, p->microbatches, mt_config_str(cfg, "optimizer.kind"), r->sched.lr,
               mt_config_str(cfg, "optimizer.schedule"), p->tp, p->pp, mt_pp_schedule_name(p->schedule), dp,
               p->dp_mode == MT_P3D_ENGINE ? mt_config_str(cfg, "parallel.engine") : "all-reduce",
               p->sequence_parallel && p->tp > 1 ? " | sequence parallel" : "");
        fflush(stdout);
    }
    return MT_OK;
}

/* Only the first stage reads tokens and only the last targets. */
static void stage_inputs(run_t *r, const mt_batch_t *b, const int32_t **tok, const int32_t **tgt) {
    int lo = 0, hi = 0;
    mt_pipeline_range(mt_par3d_pipeline(r->p3), &lo, &hi);
    *tok = lo == 0 ? b->inputs : NULL;
    *tgt = hi == mt_model_n_modules(mt_par3d_model(r->p3)) ? b->targets : NULL;
}

static mt_status_t evaluate(run_t *r, double *val_loss) {
    int64_t nb = mt_config_int(r->cfg, "train.eval_batches");
    double sum = 0.0;
    for (int64_t i = 0; i < nb; i++) {
        const mt_batch_t *b = NULL;
        MT_CHECK(mt_data_get(r->val, i, &b));
        const int32_t *tok, *tgt;
        stage_inputs(r, b, &tok, &tgt);
        float l = 0.0f;
        MT_CHECK(mt_par3d_eval(r->p3, tok, tgt, &l));
        sum += l;
    }
    *val_loss = sum / (double)nb;
    return MT_OK;
}

static mt_status_t train(run_t *r, double *final_loss) {
    const mt_config_t *cfg = r->cfg;
    int64_t steps = mt_config_int(cfg, "train.steps"), eval_every = mt_config_int(cfg, "train.eval_every");
    int64_t log_every = mt_config_int(cfg, "train.log_every");
    double tokens = (double)(r->global_batch * r->seq_len), train_s = 0.0;
    for (int64_t s = 0; s < steps; s++) {
        double t0 = mt_now();
        const mt_batch_t *b = NULL;
        MT_CHECK(mt_data_get(r->train, s, &b));
        const int32_t *tok, *tgt;
        stage_inputs(r, b, &tok, &tgt);
        float lr = mt_lr_at(&r->sched, s), loss = 0.0f;
        MT_CHECK(mt_par3d_step(r->p3, tok, tgt, lr, &loss));
        double norm = mt_par3d_last_grad_norm(r->p3);
        if (mt_par3d_last_skipped(r->p3) && r->rank == 0) {
            MT_WARN("step %lld: loss %g, gradient norm %g: skipping the update (train.on_nan = skip)", (long long)s + 1,
                    loss, norm);
        }
        double dt = mt_now() - t0;
        train_s += dt;
        *final_loss = loss;
        if (r->rank == 0 && ((s + 1) % log_every == 0 || s == 0 || s + 1 == steps)) {
            printf("step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s\n", (long long)s + 1,
                   (long long)steps, loss, lr, norm, dt * 1e3, tokens / dt);
            fflush(stdout);
        }
        if (r->val && eval_every > 0 && ((s + 1) % eval_every == 0 || s + 1 == steps)) {
            double vl = 0.0;
            MT_CHECK(evaluate(r, &vl));
            if (r->rank == 0) {
                printf("step %5lld/%lld | val loss %.6f (%lld batches)\n", (long long)s + 1, (long long)steps, vl,
                       (long long)mt_config_int(cfg, "train.eval_batches"));
                fflush(stdout);
            }
        }
    }
    if (r->rank == 0) {
        printf("done: %lld steps, final loss %.6f, %.1f s, %.0f tok/s\n", (long long)steps, *final_loss, train_s,
               train_s > 0 ? tokens * (double)steps / train_s : 0.0);
    }
    return MT_OK;
}

/* Every rank returns the worst status of all, so a verdict is the same everywhere; *all_same: every rank
 * had that status itself (a refused combination), so one rank reporting it is enough. */
static mt_status_t agree(MPI_Comm comm, mt_status_t st, bool *all_same) {
    int mine = (int)st, worst = 0, best = 0;
    if (MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS ||
        MPI_Allreduce(&mine, &best, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
        return mt_error(MT_ERR_MPI, "train3d: agreeing on the outcome failed");
    }
    *all_same = worst == best;
    if (st == MT_OK && worst != MT_OK) {
        return mt_error((mt_status_t)worst, "another rank failed (its message is above)");
    }
    return st;
}

int mt_cmd_train3d(int argc, char **argv) {
    const mt_world_t *w = mt_rt_world();
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (w->rank == 0) {
            fprintf(stderr, "meshtrain train3d: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    for (int i = 1; i < cli.rest_argc; i++) {
        const char *a = cli.rest_argv[i];
        bool help = !strcmp(a, "--help") || !strcmp(a, "-h");
        if (w->rank == 0) {
            if (help) {
                usage(stdout);
            } else {
                fprintf(stderr,
                        "meshtrain train3d: unexpected argument '%s' (keys are --section.key=value; see --help)\n", a);
            }
        }
        mt_config_cli_free(&cli);
        return help ? 0 : 2;
    }
    mt_config_t *cfg = NULL;
    mt_status_t st =
        mt_config_load_world(w->comm, cli.path ? cli.path : MT_CONFIG_EMBEDDED, cli.n_overrides, cli.overrides, &cfg);
    mt_config_cli_free(&cli);
    if (st != MT_OK) {
        return 2;
    }
    run_t r = {.cfg = cfg, .rank = w->rank};
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    st = setup(&r, &p);
    double final_loss = 0.0;
    if (st == MT_OK) {
        st = train(&r, &final_loss);
    }
    bool all_same = false;
    st = agree(w->comm, st, &all_same);
    if (st != MT_OK) {
        const char *msg = mt_last_error_msg();
        bool remote = strstr(msg, "another rank failed") != NULL;
        if (!remote && (!all_same || w->rank == 0)) {
            fprintf(stderr, "meshtrain train3d: rank %d: %s\n", w->rank, msg);
        }
    }
    mt_data_close(r.train);
    mt_data_close(r.val);
    mt_par3d_free(r.p3);
    mt_config_free(cfg);
    return st == MT_OK ? 0 : st == MT_ERR_INVALID_ARG ? 2 : 1;
}
