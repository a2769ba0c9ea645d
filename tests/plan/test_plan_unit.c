/* The planner's pieces without running jobs: the JSON reader, cluster files (and every mistake reported with
 * its line), layout validity, the enumeration's invariants, and the time model's shape: tensor parallelism
 * inside a node beats across nodes, the bubble is (p-1)/(m+p-1) of the pipelined part, 1F1B holds fewer
 * activations than GPipe, ZeRO shards what it says.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/plan_json.h"
#include "testutil.h"

#ifndef PLAN_DATA
#error PLAN_DATA must name tests/plan/data
#endif

static void test_json(void) {
    char err[128];
    pj_t *v =
        pj_parse("{\"a\": [1, 2.5e3, {\"b\": \"x\\ny\"}], \"c\": true, \"d\": null, \"e\": -3}", err, sizeof(err));
    CHECK(v != NULL, "parse failed: %s", err);
    const pj_t *a = pj_get(v, "a");
    CHECK(a && a->kind == PJ_ARR && a->n == 3, "a is an array of 3");
    if (a && a->n == 3) {
        CHECK(a->items[1]->num == 2500.0, "2.5e3 -> %g", a->items[1]->num);
        CHECK(!strcmp(pj_get(a->items[2], "b")->str, "x\ny"), "escape");
    }
    CHECK(pj_num(v, "e", 0) == -3, "e");
    CHECK(pj_get(v, "c")->kind == PJ_BOOL && pj_get(v, "c")->num == 1, "true");
    CHECK(pj_get(v, "d")->kind == PJ_NULL, "null");
    CHECK(pj_num(v, "missing", 7) == 7, "default");
    pj_free(v);
    const char *bad[] = {"[1,", "{\"a\" 1}", "tru", "{\"a\": 1} x", "\"abc", "[01x]"};
    for (size_t k = 0; k < MT_ARRAY_LEN(bad); k++) {
        v = pj_parse(bad[k], err, sizeof(err));
        CHECK(v == NULL && err[0] != '\0', "'%s' must be refused with a message", bad[k]);
        pj_free(v);
    }
}

static void test_cluster(void) {
    mt_plan_cluster_t c;
    CHECK_OK(mt_plan_cluster_load(PLAN_DATA "/tiny_cluster.toml", &c, stderr));
    CHECK(c.nodes == 2 && c.devices_per_node == 4, "shape %d x %d", c.nodes, c.devices_per_node);
    CHECK_CLOSE(c.intra.bw, 100e9, 1e-12, 0);
    CHECK_CLOSE(c.inter.latency_s, 10e-6, 1e-12, 0);
    CHECK_CLOSE(c.peak_flops[MT_PREC_FP32], 10e12, 1e-12, 0);
    mt_plan_cluster_free(&c);

    char *text = NULL;
    size_t len = 0;
    FILE *errs = open_memstream(&text, &len);
    mt_status_t st = mt_plan_cluster_load(PLAN_DATA "/bad_cluster.toml", &c, errs);
    fclose(errs);
    CHECK(st == MT_ERR_INVALID_ARG, "bad cluster file: %s", mt_status_str(st));
    const char *want[] = {"bad_cluster.toml:3: cluster.nodes = 0 is out of range",
                          "bad_cluster.toml:4: cluster.devices_per_node must be an integer",
                          "bad_cluster.toml:9: unknown key links.intra.bandwith_gbs"};
    for (size_t k = 0; k < MT_ARRAY_LEN(want); k++) {
        CHECK(text && strstr(text, want[k]), "the errors name '%s':\n%s", want[k], text ? text : "");
    }
    CHECK(text && !strstr(text, "cluster.nodes is required"), "a bad value is not also reported as missing");
    free(text);
    st = mt_plan_cluster_load(PLAN_DATA "/no_such_cluster.toml", &c, NULL);
    CHECK(st == MT_ERR_IO, "missing file: %s", mt_status_str(st));
    CHECK_OK(mt_plan_cluster_load(PLAN_SRC "/launch/clusters/dgx-a100-80g.toml", &c, stderr));
    CHECK(c.nodes * c.devices_per_node == 3072, "the Megatron cluster has 3072 GPUs");
    mt_plan_cluster_free(&c);
    CHECK_OK(mt_plan_cluster_load(PLAN_SRC "/launch/clusters/cpu-dev.toml", &c, stderr));
    CHECK(c.n_curves >= 12, "the CPU cluster's measured curves: %d", c.n_curves);
    mt_plan_cluster_free(&c);
}

static mt_plan_layout_t lay(int tp, int pp, int dp, mt_plan_engine_t e, mt_plan_sched_t s, int b, int m,
                            const char *order) {
    mt_plan_layout_t l = {.tp = tp,
                          .pp = pp,
                          .dp = dp,
                          .engine = e,
                          .schedule = s,
                          .micro_batch = b,
                          .microbatches = m,
                          .sp = false,
                          .recompute = MT_PLAN_RC_NONE};
    snprintf(l.order, sizeof(l.order), "%s", order);
    return l;
}

static void test_layouts(const mt_plan_job_t *job, const mt_plan_cluster_t *c) {
    /* validity */
    mt_plan_pred_t p, q;
    mt_plan_layout_t l = lay(3, 1, 1, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 16, 1, "tp-dp-pp");
    CHECK(mt_plan_predict(job, c, 3, &l, &p) == MT_ERR_INVALID_ARG, "n_head 4 does not split over tp 3");
    l = lay(1, 1, 8, MT_PLAN_DDP, MT_PLAN_1F1B, 2, 1, "tp-dp-pp");
    l.sp = true;
    CHECK(mt_plan_predict(job, c, 8, &l, &p) == MT_ERR_INVALID_ARG, "sequence parallelism needs tp > 1");
    l = lay(2, 1, 4, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 4, 1, "tp-dp-pp");
    l.recompute = MT_PLAN_RC_BLOCK;
    CHECK(mt_plan_predict(job, c, 8, &l, &p) == MT_ERR_INVALID_ARG, "block recompute is refused with tp");
    l = lay(1, 2, 4, MT_PLAN_ZERO2, MT_PLAN_1F1B, 2, 2, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(job, c, 8, &l, &p)); /* ZeRO-2 composes with pipelines */
    l = lay(4, 2, 1, MT_PLAN_DDP, MT_PLAN_1F1B, 4, 4, "tp-dp-pp");
    CHECK(mt_plan_predict(job, c, 8, &l, &p) == MT_ERR_INVALID_ARG, "an engine with tp/pp and dp = 1 averages nothing");
    l = lay(1, 1, 8, MT_PLAN_DDP, MT_PLAN_1F1B, 2, 2, "tp-dp-pp");
    CHECK(mt_plan_predict(job, c, 8, &l, &p) == MT_ERR_INVALID_ARG, "2 x 2 x 8 is not the global batch 16");

    /* tensor parallelism inside a node (tp-dp-pp: ranks 0-3) against across nodes (dp-tp-pp: 0,2,4,6) */
    l = lay(4, 1, 2, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 8, 1, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(job, c, 8, &l, &p));
    l = lay(4, 1, 2, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 8, 1, "dp-tp-pp");
    CHECK_OK(mt_plan_predict(job, c, 8, &l, &q));
    CHECK(!p.tp_cross_node && q.tp_cross_node, "tp-dp-pp keeps tp in a node, dp-tp-pp does not");
    CHECK(p.t_tp > 0 && q.t_tp > 5 * p.t_tp, "tp across nodes is slower: %g vs %g s", q.t_tp, p.t_tp);
    /* the order changes only which ranks share a node, so only the shared-memory segments' bytes */
    for (int k = 0; k < MT_MEM_COMM; k++) {
        CHECK(p.mem[k] == q.mem[k], "the order does not change %s", mt_mem_cat_name((mt_mem_cat_t)k));
    }
    {
        mt_plan_job_t placed = *job;
        placed.node_ranks = c->devices_per_node; /* as mt_plan_predict places 8 ranks on this cluster */
        placed.node_cpus = MT_MAX(1, c->cores_per_node / c->devices_per_node);
        mt_plan_layout_t lp = lay(4, 1, 2, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 8, 1, "tp-dp-pp");
        mt_plan_layout_t lq = lay(4, 1, 2, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 8, 1, "dp-tp-pp");
        int64_t sp = 0, sq = 0;
        CHECK_OK(mt_plan_stage_shm_bytes(&placed, &lp, 0, MT_PLAN_PATH_TRAIN, &sp));
        CHECK_OK(mt_plan_stage_shm_bytes(&placed, &lq, 0, MT_PLAN_PATH_TRAIN, &sq));
        CHECK(sp > 0 && sq > 0 && sp != sq, "tp in a node and tp across nodes share memory differently: %lld, %lld",
              (long long)sp, (long long)sq);
        CHECK(p.mem[MT_MEM_COMM] - q.mem[MT_MEM_COMM] == sp - sq, "comm differs by the segments: %lld vs %lld",
              (long long)(p.mem[MT_MEM_COMM] - q.mem[MT_MEM_COMM]), (long long)(sp - sq));
    }

    /* the pipeline bubble: (p-1)/(m+p-1) of the pipelined part */
    l = lay(1, 4, 2, MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 1, 8, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(job, c, 8, &l, &p));
    double piped = p.t_compute + p.t_tp + p.t_pp + p.t_bubble;
    CHECK_CLOSE(p.t_bubble / piped, 3.0 / 11.0, 1e-9, 0);
    CHECK(p.t_pp > 0, "stages send activations");
    /* 1F1B holds at most pp - stage micro-batches; GPipe all m */
    mt_plan_layout_t g = l;
    g.schedule = MT_PLAN_GPIPE;
    int64_t m1[MT_MEM_NCAT], m3[MT_MEM_NCAT], mg[MT_MEM_NCAT];
    CHECK_OK(mt_plan_stage_mem(job, &l, 1, m1));
    CHECK_OK(mt_plan_stage_mem(job, &l, 3, m3));
    CHECK_OK(mt_plan_stage_mem(job, &g, 1, mg));
    CHECK(m1[MT_MEM_ACTIVATIONS] < mg[MT_MEM_ACTIVATIONS], "1F1B %lld < GPipe %lld", (long long)m1[MT_MEM_ACTIVATIONS],
          (long long)mg[MT_MEM_ACTIVATIONS]);
    CHECK(m1[MT_MEM_PARAMS] < 2 * m3[MT_MEM_PARAMS] && m1[MT_MEM_PARAMS] > 0, "stages hold a share of the model");

    /* ZeRO: optimizer state sharded from stage 1, gradients from 2, parameters at 3 */
    int64_t ddp[MT_MEM_NCAT], z1[MT_MEM_NCAT], z2[MT_MEM_NCAT], z3[MT_MEM_NCAT];
    l = lay(1, 1, 8, MT_PLAN_DDP, MT_PLAN_1F1B, 2, 1, "tp-dp-pp");
    CHECK_OK(mt_plan_stage_mem(job, &l, 0, ddp));
    l.engine = MT_PLAN_ZERO1;
    CHECK_OK(mt_plan_stage_mem(job, &l, 0, z1));
    l.engine = MT_PLAN_ZERO2;
    CHECK_OK(mt_plan_stage_mem(job, &l, 0, z2));
    l.engine = MT_PLAN_ZERO3;
    CHECK_OK(mt_plan_stage_mem(job, &l, 0, z3));
    CHECK(z1[MT_MEM_OPTIMIZER] * 6 < ddp[MT_MEM_OPTIMIZER], "ZeRO-1 optimizer %lld vs DDP %lld",
          (long long)z1[MT_MEM_OPTIMIZER], (long long)ddp[MT_MEM_OPTIMIZER]);
    CHECK(z2[MT_MEM_GRADS] * 6 < z1[MT_MEM_GRADS], "ZeRO-2 gradients sharded");
    CHECK(z3[MT_MEM_PARAMS] * 6 < z2[MT_MEM_PARAMS], "ZeRO-3 parameters sharded");
    CHECK(ddp[MT_MEM_ACTIVATIONS] == z3[MT_MEM_ACTIVATIONS], "engines do not change activations");
}

/* A stand-in for the GPU trainer's sizing (this test links no CUDA code): the timing model is under test. */
static mt_status_t fake_gpu_requests(mt_model_t m, const mt_gpt2_cuda_params_t *p, size_t *bytes, mt_mem_cat_t *cats,
                                     int cap, int *n) {
    bytes[0] = 1 << 20;
    cats[0] = MT_MEM_PARAMS;
    *n = 1;
    return MT_OK;
}

/* ZeRO-2/3 under a pipeline: each micro-batch reduces the stage's gradients but the tied wte (W bytes), which
 * the engines reduce once per step after the last pass (the CPU engines a reduce-scatter, the GPU engine an
 * all-reduce); every engine sums wte over the two end stages once per step; the GPU engine's ZeRO-3 gathers
 * wte, wpe and ln_f (O bytes on the stage) once per step, the blocks per micro-batch. Without latency or
 * overlap, on 2 ranks of a node, a reduce-scatter or all-gather of x bytes takes x / (2 bw), an all-reduce
 * x / bw. DDP's t_dp gives the stage's bytes B (B + 16 for its scalar all-reduces + W for the wte sum). */
static void test_tied_once(const mt_plan_job_t *job_in, const char *cluster, bool gpu) {
    mt_plan_cluster_t c;
    CHECK_OK(mt_plan_cluster_load(cluster, &c, stderr));
    CHECK(c.gpu == gpu, "%s: device kind", cluster);
    c.intra.latency_s = c.inter.latency_s = 0;
    c.overlap_dp = 0;
    c.n_curves = 0;
    mt_plan_set_gpu_requests(gpu ? fake_gpu_requests : NULL);
    mt_plan_job_t job = *job_in;
    int b = 2, C = job.model.n_embd;
    int Vp = job.model.padded_vocab ? job.model.padded_vocab : (job.model.vocab_size + 127) / 128 * 128;
    double W = (double)Vp * C * 4, bw = c.intra.bw;
    mt_plan_pred_t ddp, z[2][2]; /* [ZeRO-2, ZeRO-3][2, 4 micro-batches] */
    job.global_batch = b * 2 * 2;
    mt_plan_layout_t l = lay(1, 2, 2, MT_PLAN_DDP, MT_PLAN_1F1B, b, 2, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(&job, &c, 4, &l, &ddp));
    for (int k = 0; k < 2; k++) {
        l.engine = k ? MT_PLAN_ZERO3 : MT_PLAN_ZERO2;
        for (int m = 0; m < 2; m++) {
            l.microbatches = 2 << m;
            job.global_batch = b * l.microbatches * 2;
            CHECK_OK(mt_plan_predict(&job, &c, 4, &l, &z[k][m]));
            CHECK(z[k][m].mem_stage == ddp.mem_stage, "%s: the same stage: %d vs %d", cluster, z[k][m].mem_stage,
                  ddp.mem_stage);
        }
    }
    CHECK(!ddp.dp_cross_node, "dp inside a node");
    double B = ddp.t_dp * bw - 16 - W;
    double O = gpu ? W + (ddp.mem_stage == 0 ? (double)job.model.seq_len * C * 4 : 2.0 * C * 4) : 0;
    double once = gpu ? W / bw : W / (2 * bw), rest = 16 / bw + W / bw;
    CHECK(B > 2 * W, "stage bytes %g, wte %g", B, W);
    /* ZeRO-2: per micro-batch (B - W) / (2 bw); once: wte's reduction and the all-gather of B */
    CHECK_CLOSE(z[0][1].t_dp - z[0][0].t_dp, (B - W) / bw, 1e-9, 1e-15);
    CHECK_CLOSE(z[0][0].t_dp, 2 * (B - W) / (2 * bw) + once + B / (2 * bw) + rest, 1e-9, 1e-15);
    /* ZeRO-3: per micro-batch two all-gathers of B - O and the reduce-scatter of B - W; once: O's gather */
    CHECK_CLOSE(z[1][1].t_dp - z[1][0].t_dp, (2 * (B - O) + (B - W)) / bw, 1e-9, 1e-15);
    CHECK_CLOSE(z[1][0].t_dp, 2 * (2 * (B - O) + (B - W)) / (2 * bw) + O / (2 * bw) + once + rest, 1e-9, 1e-15);
    mt_plan_set_gpu_requests(NULL);
    mt_plan_cluster_free(&c);
}

/* NCCL's own buffers (device.nccl_comm_gib, GPU engine): each NCCL communicator of a rank takes that much beside
 * the allocator's blocks, which stay as they were; what must fit is their sum on the rank that needs the most (a
 * pipeline of more than 2 stages has the tied embedding's pair on its end stages too); with the collectives
 * through MPI there is none. */
static void test_nccl_memory(const mt_plan_job_t *job_in) {
    mt_plan_cluster_t c;
    CHECK_OK(mt_plan_cluster_load(PLAN_DATA "/tiny_gpu_cluster.toml", &c, stderr));
    CHECK(c.nccl_comm_bytes == 0, "device.nccl_comm_gib defaults to 0: %g", c.nccl_comm_bytes);
    mt_plan_set_gpu_requests(fake_gpu_requests);
    static const struct {
        int tp, pp, dp, comms;
    } cases[] = {{1, 1, 4, 1}, {2, 1, 2, 2}, {4, 1, 1, 1}, {1, 4, 1, 2}, {2, 2, 2, 3}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mt_plan_job_t job = *job_in;
        mt_plan_layout_t l = lay(cases[i].tp, cases[i].pp, cases[i].dp,
                                 cases[i].dp > 1 ? MT_PLAN_DDP : MT_PLAN_ALLREDUCE, MT_PLAN_1F1B, 1, 4, "tp-dp-pp");
        job.global_batch = 4 * cases[i].dp;
        mt_plan_pred_t none, with, staged;
        int world = cases[i].tp * cases[i].pp * cases[i].dp;
        c.nccl_comm_bytes = 0;
        CHECK_OK(mt_plan_predict(&job, &c, world, &l, &none));
        CHECK(none.nccl == 0 && none.fits, "case %zu: no NCCL figure: %lld bytes, fits %d", i, (long long)none.nccl,
              (int)none.fits);
        c.nccl_comm_bytes = 1 << 30;
        CHECK_OK(mt_plan_predict(&job, &c, world, &l, &with));
        CHECK(with.mem_total == none.mem_total && with.nccl == (int64_t)cases[i].comms << 30,
              "case %zu (tp %d pp %d dp %d): NCCL %lld bytes, want %d GiB; allocator %lld vs %lld", i, cases[i].tp,
              cases[i].pp, cases[i].dp, (long long)with.nccl, cases[i].comms, (long long)with.mem_total,
              (long long)none.mem_total);
        /* just too little room for them: over by one byte's worth */
        c.nccl_comm_bytes = (c.mem_bytes - (double)with.mem_total) / cases[i].comms + 1;
        CHECK_OK(mt_plan_predict(&job, &c, world, &l, &with));
        CHECK(!with.fits && with.over > 0 && with.over <= 2 * cases[i].comms, "case %zu: over by %lld bytes", i,
              (long long)with.over);
        job.gpu_staged = true;
        CHECK_OK(mt_plan_predict(&job, &c, world, &l, &staged));
        CHECK(staged.nccl == 0, "case %zu: runtime.gpu_comm = mpi: %lld NCCL bytes", i, (long long)staged.nccl);
    }
    mt_plan_set_gpu_requests(NULL);
    mt_plan_cluster_free(&c);
}

static void test_enumerate(const mt_plan_job_t *job, const mt_plan_cluster_t *c) {
    mt_plan_opts_t o = {.world = 8, .micro_batch = 0};
    mt_plan_pred_t *v = NULL;
    int n = 0;
    CHECK_OK(mt_plan_enumerate(job, c, &o, &v, &n));
    CHECK(n > 100, "%d layouts of 8 ranks", n);
    bool seen_tp = false, seen_pp = false, seen_zero3 = false, seen_sp = false, seen_gpipe = false;
    for (int i = 0; i < n; i++) {
        const mt_plan_layout_t *l = &v[i].l;
        CHECK(l->tp * l->pp * l->dp == 8, "layout %d: %d x %d x %d", i, l->tp, l->pp, l->dp);
        CHECK((int64_t)l->micro_batch * l->microbatches * l->dp == job->global_batch, "layout %d batch", i);
        if (i > 0) {
            CHECK(v[i - 1].fits >= v[i].fits, "fitting layouts first");
            CHECK(!(v[i - 1].fits && v[i].fits) || v[i - 1].t_step <= v[i].t_step, "sorted by step time at %d", i);
        }
        CHECK(fabs(v[i].t_step - (v[i].t_compute + v[i].t_tp + v[i].t_pp + v[i].t_dp + v[i].t_bubble + v[i].t_optim)) <
                  1e-12,
              "the breakdown adds up");
        seen_tp |= l->tp > 1;
        seen_pp |= l->pp > 1;
        seen_zero3 |= l->engine == MT_PLAN_ZERO3;
        seen_sp |= l->sp;
        seen_gpipe |= l->schedule == MT_PLAN_GPIPE;
    }
    CHECK(seen_tp && seen_pp && seen_zero3 && seen_sp && seen_gpipe, "every dimension is enumerated");
    char ov[512];
    mt_plan_layout_overrides(&v[0].l, ov, sizeof(ov));
    CHECK(strstr(ov, "--parallel.tp=") && strstr(ov, "--train.micro_batch="), "override line: %s", ov);
    free(v);
    o.micro_batch = 2;
    CHECK_OK(mt_plan_enumerate(job, c, &o, &v, &n));
    for (int i = 0; i < n; i++) {
        CHECK(v[i].l.micro_batch == 2, "--micro-batch 2 keeps b = 2");
    }
    free(v);
}

/* A GPU cluster: device.kind read; without the GPU trainer's sizing registered (this test links no CUDA
 * code) planning is refused naming the build, for either model; runtime.device = "cpu" plans the job on the host
 * engines instead. */
static void test_gpu_cluster(const mt_plan_job_t *job_in) {
    mt_plan_cluster_t g;
    CHECK_OK(mt_plan_cluster_load(PLAN_DATA "/tiny_gpu_cluster.toml", &g, stderr));
    CHECK(g.gpu, "device.kind = \"gpu\" not read");
    mt_plan_opts_t o = {.world = 4};
    mt_plan_pred_t *v = NULL;
    int n = 0;
    mt_status_t st = mt_plan_enumerate(job_in, &g, &o, &v, &n);
    CHECK(st == MT_ERR_INVALID_USAGE && strstr(mt_last_error_msg(), "built without the GPU path"),
          "GPU cluster without the sizing: %s: %s", mt_status_str(st), mt_last_error_msg());
    free(v);
    mt_plan_job_t mlp = *job_in;
    mlp.model.kind = MT_MODEL_MLP;
    st = mt_plan_enumerate(&mlp, &g, &o, &v, &n);
    CHECK(st == MT_ERR_INVALID_USAGE && strstr(mt_last_error_msg(), "built without the GPU path"),
          "an MLP on a GPU cluster without the sizing: %s: %s", mt_status_str(st), mt_last_error_msg());
    mt_plan_job_t host = *job_in;
    host.cpu_only = true; /* runtime.device = "cpu": the host engines, whatever the devices */
    v = NULL;
    CHECK_OK(mt_plan_enumerate(&host, &g, &o, &v, &n));
    CHECK(n > 0, "runtime.device = cpu on a GPU cluster: %d layouts", n);
    free(v);
    mt_plan_cluster_free(&g);

    char *text = NULL;
    size_t len = 0;
    FILE *errs = open_memstream(&text, &len);
    st = mt_plan_cluster_load(PLAN_DATA "/bad_kind_cluster.toml", &g, errs);
    fclose(errs);
    CHECK(st == MT_ERR_INVALID_ARG && text && strstr(text, "bad_kind_cluster.toml:6: device.kind = \"tpu\""),
          "device.kind = tpu: %s: %s", mt_status_str(st), text ? text : "");
    free(text);
    mt_plan_cluster_free(&g);
}

/* The MLP's recomputation repeats each hidden layer's product: with recompute = block the compute time grows by
 * 2 x the hidden layers' elements over 6 x the elements of every product's weight (tp = pp = 1: time is FLOPs over
 * one rate). */
static void test_mlp_recompute(const mt_plan_job_t *job_in, const mt_plan_cluster_t *c) {
    mt_plan_job_t job = *job_in;
    job.model.kind = MT_MODEL_MLP;
    mt_plan_pred_t p, q;
    mt_plan_layout_t l = lay(1, 1, 8, MT_PLAN_DDP, MT_PLAN_1F1B, 2, 1, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(&job, c, 8, &l, &p));
    l.recompute = MT_PLAN_RC_BLOCK;
    CHECK_OK(mt_plan_predict(&job, c, 8, &l, &q));
    double H = job.model.n_embd, V = job.model.vocab_size, L = job.model.n_layer;
    double hidden = L * (H * H + H), all = hidden + V * H + V; /* wte: a lookup, no product */
    CHECK(p.t_compute > 0, "mlp compute time %g", p.t_compute);
    CHECK_CLOSE(q.t_compute / p.t_compute, 1.0 + 2.0 * hidden / (6.0 * all), 1e-12, 0);
}

/* model.head_chunks > 1 recomputes the logits: the head's product once more, 2 x the head weight's elements over
 * 6 x every product's (the MLP at tp = pp = 1, as above); its activation memory falls (the logits leave the
 * micro-batch). */
static void test_head_chunks(const mt_plan_job_t *job_in, const mt_plan_cluster_t *c) {
    mt_plan_job_t job = *job_in;
    job.model.kind = MT_MODEL_MLP;
    mt_plan_pred_t p, q;
    mt_plan_layout_t l = lay(1, 1, 8, MT_PLAN_DDP, MT_PLAN_1F1B, 2, 1, "tp-dp-pp");
    CHECK_OK(mt_plan_predict(&job, c, 8, &l, &p));
    job.model.head_chunks = 4;
    CHECK_OK(mt_plan_predict(&job, c, 8, &l, &q));
    double H = job.model.n_embd, V = job.model.vocab_size, L = job.model.n_layer;
    double all = L * (H * H + H) + V * H + V;
    CHECK_CLOSE(q.t_compute / p.t_compute, 1.0 + 2.0 * V * H / (6.0 * all), 1e-12, 0);
    CHECK(q.mem[MT_MEM_ACTIVATIONS] < p.mem[MT_MEM_ACTIVATIONS], "head chunks: activations %lld < %lld",
          (long long)q.mem[MT_MEM_ACTIVATIONS], (long long)p.mem[MT_MEM_ACTIVATIONS]);
}

int main(void) {
    test_json();
    test_cluster();
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(PLAN_DATA "/tiny_job.toml", 0, NULL, 0, &cfg, stderr));
    mt_plan_cluster_t c;
    CHECK_OK(mt_plan_cluster_load(PLAN_DATA "/tiny_cluster.toml", &c, stderr));
    if (cfg) {
        mt_plan_job_t job;
        CHECK_OK(mt_plan_job_from_config(cfg, &job));
        test_layouts(&job, &c);
        test_tied_once(&job, PLAN_DATA "/tiny_cluster.toml", false);
        test_tied_once(&job, PLAN_DATA "/tiny_gpu_cluster.toml", true);
        test_enumerate(&job, &c);
        test_gpu_cluster(&job);
        test_nccl_memory(&job);
        test_mlp_recompute(&job, &c);
        test_head_chunks(&job, &c);
        mt_config_free(cfg);
    }
    mt_plan_cluster_free(&c);
    return mt_test_finish("test_plan_unit");
}
