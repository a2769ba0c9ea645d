/* `meshtrain train [CONFIG.toml] [--section.key=value ...]`: trains the model the config describes
 * (the embedded default job without CONFIG), printing a progress line per step on rank 0. Start-up:
 * config (validated on rank 0, broadcast), topology and binding (runtime.bind), the mesh in
 * parallel.order ("auto" follows the hardware), then the engine: the single-process one on one rank,
 * a data-parallel engine (parallel.engine, zero_stage) over the mesh's dp groups when tp = pp = 1, the
 * model-parallel one otherwise (train/job_mp.c: tensor and pipeline parallelism from parallel3d.h, dp by
 * the same engines holding only each stage's parameters); runtime.device = "cuda" (or "auto" with a GPU
 * on every rank and a config the GPU path runs) takes the GPU engine. `meshtrain train3d` is this command.
 * Exit status: 0 trained, 2 bad input (config, data files, layout), 1 failure while running, 3 the watchdog
 * ended a hung job, 128 + N stopped cleanly on signal N (143: SIGTERM) after writing a checkpoint.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "train/job.h"
#include "runtime/config.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"
#include "runtime/signals.h"
#include "runtime/topo.h"

static void usage(FILE *out) {
    fprintf(out, "usage: [mpirun -np N | srun -n N] meshtrain train [CONFIG.toml] [--section.key=value ...]\n"
                 "Trains the model the config describes on the parallel.tp x parallel.pp x parallel.dp mesh of the N\n"
                 "ranks: forward, backward over train.grad_accum micro-batches (with pp > 1 the pipeline's\n"
                 "micro-batches, parallel.schedule = gpipe|1f1b, parallel.stage_layers; parallel.sequence_parallel\n"
                 "with tp > 1), gradients averaged over dp by parallel.engine (dp, ddp, zero + parallel.zero_stage;\n"
                 "with tp or pp > 1 the engine holds only its stage's parameters; parallel.dp_reduce = allreduce\n"
                 "uses one all-reduce instead), clipping to optimizer.grad_clip by the global norm, an optimizer\n"
                 "step, validation every train.eval_every steps, a progress line per train.log_every steps\n"
                 "(loss, lr, gradient norm, ms, tokens/s, MFU, memory, exposed communication, ETA) and a summary.\n"
                 "metrics.jsonl, profile.trace / profile.memory and checkpoint.* write metrics, a timeline, the\n"
                 "allocator history and checkpoints (docs/metrics.md, docs/training.md, docs/checkpoints.md).\n"
                 "Without CONFIG it runs the embedded default job (launch/configs/demo.toml: tp 2 x dp 2 on 4 ranks).\n"
                 "`meshtrain train3d` is the same command. `meshtrain config --help` lists every key.\n"
                 "Exit status: 0 done, 2 bad input, 1 failure, 3 hang (watchdog), 128+N stopped on signal N\n"
                 "(143 = SIGTERM, checkpoint written).\n");
}

/* Groups along one axis as "{0,2} {1,3}" (at most a few shown). */
static void groups_str(const mt_mesh_t *mesh, mt_axis_t axis, char *buf, size_t len) {
    int world = mt_mesh_world(mesh), shown = 0;
    size_t o = 0;
    int *ranks = malloc((size_t)world * sizeof(int));
    buf[0] = '\0';
    for (int r = 0; ranks && r < world && shown < 4; r++) {
        int idx = 0, n = mt_mesh_group(mesh, r, MT_AXIS_BIT(axis), ranks, &idx);
        if (idx != 0) {
            continue; /* each group once, from its first rank */
        }
        o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s{", shown ? " " : "");
        for (int k = 0; k < n; k++) {
            o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%d", k ? "," : "", ranks[k]);
        }
        o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "}");
        shown++;
    }
    if (shown == 4 && world / mt_mesh_axis_size(mesh, axis) > 4) {
        snprintf(buf + o, o < len ? len - o : 0, " ...");
    }
    free(ranks);
}

/* Topology and binding, parallel.order ("auto" resolved from the hardware), the mesh and its description.
 * Collective; every rank returns the same status. */
static mt_status_t build_mesh(const mt_config_t *cfg, mt_mesh_t **mesh, char *desc, size_t len) {
    const mt_world_t *w = mt_rt_world();
    mt_topo_t *topo = NULL;
    mt_topo_report_t rep;
    MT_CHECK(mt_topo_startup(cfg, &topo, &rep));
    mt_settings_t set;
    mt_status_t st = mt_settings_read(cfg, &set);
    int tp = set.par.tp, pp = set.par.pp, dp = set.par.dp;
    bool use_gpus = strcmp(mt_config_str(cfg, "runtime.device"), "cpu") != 0;
    char order[16], why[256], warn[256];
    if (st == MT_OK) {
        st = mt_topo_resolve_order(topo, &rep, set.par.order, tp, pp, dp, use_gpus, order, why, sizeof(why), warn,
                                   sizeof(warn));
    }
    mt_topo_free(topo);
    MT_CHECK(st);
    if (warn[0] && w->rank == 0) {
        MT_WARN("parallel.order: %s", warn);
    }
    MT_CHECK(mt_mesh_create(w->size, tp, pp, dp, order, mesh));
    size_t o = (size_t)snprintf(desc, len, "%d rank%s = tp %d x dp %d x pp %d, order %s (fastest first)%s%s", w->size,
                                w->size == 1 ? "" : "s", mt_mesh_axis_size(*mesh, MT_AXIS_TP),
                                mt_mesh_axis_size(*mesh, MT_AXIS_DP), mt_mesh_axis_size(*mesh, MT_AXIS_PP), order,
                                why[0] ? ": " : "", why);
    for (int a = 0; a < MT_AXIS_N; a++) {
        if (mt_mesh_axis_size(*mesh, (mt_axis_t)a) > 1 && o < len) {
            char g[256];
            groups_str(*mesh, (mt_axis_t)a, g, sizeof(g));
            o += (size_t)snprintf(desc + o, len - o, "; %s groups %s", mt_axis_name((mt_axis_t)a), g);
        }
    }
    if (o < len && rep.action == MT_BIND_KEPT_LAUNCHER && rep.device.kind != MT_DEVKIND_GPU &&
        rep.n_threads < rep.plan.n_cores) {
        /* mpirun binds each of up to two ranks to one core: a one-rank job on a many-core node uses one */
        char bound[128];
        mt_cpuset_format(&rep.bound, bound, sizeof(bound));
        snprintf(desc + o, len - o,
                 "; rank 0 on cpu:%s, %d thread%s (kept-launcher: the launcher bound it to %d of the %d cores "
                 "planned for it; launch with `mpirun --bind-to none` or `srun --cpu-bind=none`, or set "
                 "runtime.bind = \"force\", to use them all)",
                 bound, rep.n_threads, rep.n_threads == 1 ? "" : "s", rep.n_threads, rep.plan.n_cores);
    } else if (o < len) {
        snprintf(desc + o, len - o, "; rank 0 on %s, %d thread%s (%s)", rep.device_str, rep.n_threads,
                 rep.n_threads == 1 ? "" : "s", mt_topo_bind_action_str(rep.action));
    }
    return MT_OK;
}

int mt_cmd_train(int argc, char **argv) {
    const mt_world_t *w = mt_rt_world();
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (w->rank == 0) {
            fprintf(stderr, "meshtrain train: %s\n", mt_last_error_msg());
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
                        "meshtrain train: unexpected argument '%s' (keys are --section.key=value; see "
                        "--help)\n",
                        a);
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
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.progress = stdout;
    mt_mesh_t *mesh = NULL;
    char desc[1024] = "";
    st = build_mesh(cfg, &mesh, desc, sizeof(desc));
    if (st != MT_OK) {
        if (w->rank == 0) {
            fprintf(stderr, "meshtrain train: %s\n", mt_last_error_msg());
        }
        mt_config_free(cfg);
        return st == MT_ERR_INVALID_ARG ? 2 : 1;
    }
    int coords[MT_AXIS_N];
    mt_mesh_coords(mesh, w->rank, coords);
    opts.mesh = mesh;
    opts.mesh_desc = desc;
    opts.dp_rank = coords[MT_AXIS_DP];
    opts.dp_size = mt_mesh_axis_size(mesh, MT_AXIS_DP);
    int tp = mt_mesh_axis_size(mesh, MT_AXIS_TP), pp = mt_mesh_axis_size(mesh, MT_AXIS_PP);
    if (tp > 1 || pp > 1) {
        opts.engine = mt_job_engine_model_parallel(pp);
    } else {
        opts.engine = w->size == 1 ? mt_job_engine_local() : mt_job_engine_parallel();
    }
    bool on_gpu = false; /* runtime.device: "cuda", or "auto" with a GPU on every rank, trains on the GPUs */
    char note[1024];
    st = mt_job_cuda_choose(cfg, w->comm, &on_gpu, note, sizeof(note));
    if (st != MT_OK) {
        const char *msg = mt_last_error_msg();
        if (w->rank == 0 || (strstr(msg, "sees no CUDA device") && !strstr(msg, "another rank"))) {
            fprintf(stderr, "meshtrain train: %s\n", msg);
        }
        mt_config_free(cfg);
        mt_mesh_free(mesh);
        return st == MT_ERR_INVALID_ARG ? 2 : 1;
    }
    if (note[0] && w->rank == 0) {
        printf("note: %s\n", note);
    }
    if (on_gpu) {
        opts.engine = mt_job_engine_cuda();
    }
    mt_job_result_t res;
    st = mt_job_run(cfg, &opts, &res);
    mt_config_free(cfg);
    mt_mesh_free(mesh);
    if (st != MT_OK) {
        const char *msg = mt_last_error_msg();
        bool remote = strstr(msg, "another rank failed") != NULL;
        if (!remote || w->rank == 0) {
            if (w->size > 1) {
                fprintf(stderr, "meshtrain train: rank %d: %s\n", w->rank, msg);
            } else {
                fprintf(stderr, "meshtrain train: %s\n", msg);
            }
        }
        int sig = res.stop_signal;
        mt_job_result_free(&res);
        if (sig) {
            return mt_signals_exit_status(sig); /* 143 for SIGTERM: stopped cleanly, checkpoint written */
        }
        return st == MT_ERR_INVALID_ARG ? 2 : 1;
    }
    if (w->rank == 0 && res.n_steps > 0) {
        printf("done: %lld steps, final loss %.6f", (long long)res.n_steps, res.loss[res.n_steps - 1]);
        if (res.n_evals > 0) {
            printf(", val loss %.6f", res.val_loss[res.n_evals - 1]);
        }
        printf(", %.1f s, %.0f tok/s\n", res.seconds, res.tokens_per_s);
    }
    mt_job_result_free(&res);
    return 0;
}
