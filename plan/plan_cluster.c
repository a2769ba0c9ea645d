/* Cluster files for the planner: a TOML file (read with the runtime's TOML-subset parser) describing the
 * nodes, the devices' memory and rates, the links, or `meshtrain bench coll --json` results measured on
 * the cluster. Every key is declared in one table with its range; problems are reported all at once.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "plan/plan_json.h"
#include "runtime/config_toml.h"

typedef enum { CK_INT, CK_FLOAT, CK_BOOL, CK_STR } ckind_t;

typedef struct {
    const char *key;
    ckind_t kind;
    double min, max;
    const char *help;
} ckey_t;

static const ckey_t keys[] = {
    {"cluster.name", CK_STR, 0, 0, "a name for reports"},
    {"cluster.nodes", CK_INT, 1, 1e7, "nodes"},
    {"cluster.devices_per_node", CK_INT, 1, 4096, "devices (GPUs, or ranks on CPU nodes) per node"},
    {"cluster.shared_node", CK_BOOL, 0, 1, "CPU nodes: the device figures are the node's, shared by its ranks"},
    {"cluster.cores_per_node", CK_INT, 1, 1e6, "shared nodes: cores (a rank runs on cores / ranks of them)"},
    {"device.kind", CK_STR, 0, 0, "\"gpu\" (jobs run on the GPU engine) or \"cpu\" (the host engines)"},
    {"device.multithread_efficiency", CK_FLOAT, 1e-3, 1, "a rank on k > 1 cores: k x this x one core's rate"},
    {"device.memory_gib", CK_FLOAT, 1e-6, 1e9, "memory per device (GiB)"},
    {"device.reserve_gib", CK_FLOAT, 0, 1e9, "memory per device left free for the runtime (GiB)"},
    {"device.nccl_comm_gib", CK_FLOAT, 0, 1e6, "device memory NCCL takes per communicator (GiB)"},
    {"device.peak_tflops_fp32", CK_FLOAT, 0, 1e9, "peak fp32 rate (TFLOP/s)"},
    {"device.peak_tflops_tf32", CK_FLOAT, 0, 1e9, "peak tf32 rate (TFLOP/s)"},
    {"device.peak_tflops_bf16", CK_FLOAT, 0, 1e9, "peak bf16 rate (TFLOP/s)"},
    {"device.peak_tflops_fp16", CK_FLOAT, 0, 1e9, "peak fp16 rate (TFLOP/s)"},
    {"device.efficiency", CK_FLOAT, 1e-4, 1, "achieved fraction of peak on large matrix products"},
    {"device.efficiency_half_work", CK_FLOAT, 0, 1e15, "B*T*C*(C/tp) of a micro-batch at which efficiency halves"},
    {"device.attention_efficiency", CK_FLOAT, 1e-4, 1, "attention's products: fraction of the matmul efficiency"},
    {"device.memory_bw_gbs", CK_FLOAT, 1e-6, 1e9, "device memory bandwidth (GB/s)"},
    {"links.intra.latency_us", CK_FLOAT, 0, 1e9, "latency inside a node (us)"},
    {"links.intra.bandwidth_gbs", CK_FLOAT, 1e-9, 1e9, "collective bus bandwidth per device inside a node (GB/s)"},
    {"links.inter.latency_us", CK_FLOAT, 0, 1e9, "latency between nodes (us)"},
    {"links.inter.bandwidth_gbs", CK_FLOAT, 1e-9, 1e9, "collective bus bandwidth per device between nodes (GB/s)"},
    {"overlap.dp", CK_FLOAT, 0, 1, "fraction of backward that hides data-parallel gradient traffic"},
    {"bench.intra_json", CK_STR, 0, 0, "`meshtrain bench coll --json` results measured inside a node"},
    {"bench.inter_json", CK_STR, 0, 0, "`meshtrain bench coll --json` results measured across nodes"},
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

typedef struct {
    bool seen; /* given in the file (valid or not) */
    bool set;  /* given and valid */
    int line;
    double num;
    bool b;
    char *s;
} cval_t;

typedef struct {
    const char *path;
    FILE *errors;
    int n_errors;
    cval_t vals[NKEYS];
} cctx_t;

static void report(cctx_t *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(cctx_t *c, int line, const char *fmt, ...) {
    c->n_errors++;
    if (!c->errors) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    if (line > 0) {
        fprintf(c->errors, "%s:%d: ", c->path, line);
    } else {
        fprintf(c->errors, "%s: ", c->path);
    }
    vfprintf(c->errors, fmt, ap);
    fprintf(c->errors, "\n");
    va_end(ap);
}

static const char *kind_name(ckind_t k) {
    return k == CK_INT ? "an integer" : k == CK_FLOAT ? "a number" : k == CK_BOOL ? "true or false" : "a string";
}

static void on_kv(void *arg, const char *key, int line, mt_toml_value_t *v) {
    cctx_t *c = arg;
    size_t k = 0;
    while (k < NKEYS && strcmp(keys[k].key, key) != 0) {
        k++;
    }
    if (k == NKEYS) {
        report(c, line,
               "unknown key %s (cluster keys: cluster.*, device.*, links.intra.*, links.inter.*, "
               "overlap.dp, bench.*; docs/planning.md lists them)",
               key);
        free(v->s);
        return;
    }
    const ckey_t *d = &keys[k];
    cval_t *out = &c->vals[k];
    out->seen = true;
    bool ok = true;
    if (d->kind == CK_STR) {
        ok = v->kind == MT_TOML_STRING;
        if (ok) {
            out->s = v->s;
            v->s = NULL;
        }
    } else if (d->kind == CK_BOOL) {
        ok = v->kind == MT_TOML_BOOL;
        out->b = v->b;
    } else if (v->kind == MT_TOML_INT) {
        out->num = (double)v->i;
    } else if (v->kind == MT_TOML_FLOAT && d->kind == CK_FLOAT) {
        out->num = v->f;
    } else {
        ok = false;
    }
    free(v->s);
    if (!ok) {
        report(c, line, "%s must be %s (%s)", key, kind_name(d->kind), d->help);
        return;
    }
    if ((d->kind == CK_INT || d->kind == CK_FLOAT) && !(out->num >= d->min && out->num <= d->max)) {
        report(c, line, "%s = %g is out of range [%g, %g] (%s)", key, out->num, d->min, d->max, d->help);
        return;
    }
    out->set = true;
    out->line = line;
}

static void on_error(void *arg, int line, const char *msg) {
    report(arg, line, "%s", msg);
}

static const cval_t *val(const cctx_t *c, const char *key) {
    for (size_t k = 0; k < NKEYS; k++) {
        if (!strcmp(keys[k].key, key)) {
            return &c->vals[k];
        }
    }
    MT_ABORT("plan: cluster key %s is not in the table", key);
}

static double num(const cctx_t *c, const char *key, double dflt) {
    const cval_t *v = val(c, key);
    return v->set ? v->num : dflt;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            cap *= 2;
            char *t = realloc(buf, cap);
            if (!t) {
                free(buf);
                buf = NULL;
            }
            buf = t;
        }
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
    }
    if (len) {
        *len = n;
    }
    return buf;
}

/* path relative to the directory of base, unless absolute. */
static void relative_to(const char *base, const char *path, char *out, size_t len) {
    const char *slash = strrchr(base, '/');
    if (path[0] == '/' || !slash) {
        snprintf(out, len, "%s", path);
    } else {
        snprintf(out, len, "%.*s/%s", (int)(slash - base), base, path);
    }
}

mt_status_t mt_plan_cluster_add_bench(mt_plan_cluster_t *c, const char *json_path, bool inter) {
    char *text = read_file(json_path, NULL);
    if (!text) {
        return mt_error(MT_ERR_IO, "cannot read the bench results %s: %s", json_path, strerror(errno));
    }
    char err[160];
    pj_t *doc = pj_parse(text, err, sizeof(err));
    free(text);
    const pj_t *res = pj_get(doc, "results");
    if (!doc || !res || res->kind != PJ_ARR) {
        pj_free(doc);
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s is not `meshtrain bench coll --json` output (%s): expected {\"results\": [...]}", json_path,
                        doc ? "no \"results\" array" : err);
    }
    mt_status_t st = MT_OK;
    for (int r = 0; r < res->n && st == MT_OK; r++) {
        const pj_t *e = res->items[r];
        const pj_t *op = pj_get(e, "op"), *rows = pj_get(e, "rows");
        int ranks = (int)pj_num(e, "ranks", 0);
        if (!op || op->kind != PJ_STR || !rows || rows->kind != PJ_ARR || ranks < 1) {
            st = mt_error(MT_ERR_INVALID_ARG, "%s: result %d lacks op, ranks or rows", json_path, r);
            break;
        }
        if (c->n_curves == MT_PLAN_MAX_CURVES) {
            st = mt_error(MT_ERR_INVALID_ARG, "%s: more than %d curves", json_path, MT_PLAN_MAX_CURVES);
            break;
        }
        mt_plan_curve_t *cv = &c->curves[c->n_curves];
        memset(cv, 0, sizeof(*cv));
        snprintf(cv->op, sizeof(cv->op), "%s", op->str);
        cv->ranks = ranks;
        cv->inter = inter;
        cv->size = calloc((size_t)rows->n + 1, sizeof(double));
        cv->time = calloc((size_t)rows->n + 1, sizeof(double));
        if (!cv->size || !cv->time) {
            free(cv->size);
            free(cv->time);
            st = mt_error(MT_ERR_OOM, "out of memory reading %s", json_path);
            break;
        }
        for (int k = 0; k < rows->n; k++) {
            const pj_t *row = rows->items[k];
            double size = pj_num(row, "size", -1);
            double t = pj_num(pj_get(row, "out_of_place"), "time_us", -1);
            if (size <= 0 || t <= 0 || (cv->n > 0 && size <= cv->size[cv->n - 1])) {
                continue; /* zero-byte rows and unsorted repeats carry no bandwidth information */
            }
            cv->size[cv->n] = size;
            /* a larger message never takes less time: a noisy sample on a shared machine is lifted to the
             * time of the smaller size before it (running maximum) */
            cv->time[cv->n] = cv->n > 0 ? MT_MAX(t * 1e-6, cv->time[cv->n - 1]) : t * 1e-6;
            cv->n++;
        }
        if (cv->n == 0) {
            free(cv->size);
            free(cv->time);
            continue;
        }
        c->n_curves++;
    }
    pj_free(doc);
    return st;
}

mt_status_t mt_plan_cluster_load(const char *path, mt_plan_cluster_t *out, FILE *errors) {
    memset(out, 0, sizeof(*out));
    char *text = read_file(path, NULL);
    if (!text) {
        if (errors) {
            fprintf(errors, "%s: cannot read the cluster file: %s\n", path, strerror(errno));
        }
        return mt_error(MT_ERR_IO, "cannot read the cluster file %s: %s", path, strerror(errno));
    }
    cctx_t c = {.path = path, .errors = errors};
    mt_toml_parse(text, on_kv, on_error, &c);
    free(text);
    static const char *required[] = {"cluster.nodes", "cluster.devices_per_node", "device.memory_gib"};
    for (size_t k = 0; k < MT_ARRAY_LEN(required); k++) {
        if (!val(&c, required[k])->seen) {
            report(&c, 0, "%s is required", required[k]);
        }
    }
    mt_plan_cluster_t *cl = out;
    snprintf(cl->path, sizeof(cl->path), "%s", path);
    snprintf(cl->name, sizeof(cl->name), "%s", val(&c, "cluster.name")->set ? val(&c, "cluster.name")->s : path);
    cl->nodes = (int)num(&c, "cluster.nodes", 1);
    cl->devices_per_node = (int)num(&c, "cluster.devices_per_node", 1);
    cl->shared_node = val(&c, "cluster.shared_node")->set && val(&c, "cluster.shared_node")->b;
    cl->cores_per_node = (int)num(&c, "cluster.cores_per_node", cl->devices_per_node);
    const cval_t *kind = val(&c, "device.kind");
    if (kind->set && strcmp(kind->s, "gpu") != 0 && strcmp(kind->s, "cpu") != 0) {
        report(&c, kind->line, "device.kind = \"%s\": expected \"gpu\" (jobs run on the GPU engine) or \"cpu\"",
               kind->s);
    }
    cl->gpu = kind->set && !strcmp(kind->s, "gpu");
    if (cl->gpu && cl->shared_node) {
        report(&c, kind->line, "device.kind = \"gpu\" with cluster.shared_node = true: a GPU is one rank's device, "
               "not shared by the node's ranks (drop shared_node)");
    }
    cl->multithread_efficiency = num(&c, "device.multithread_efficiency", 1.0);
    cl->mem_bytes = num(&c, "device.memory_gib", 1) * 1073741824.0;
    cl->reserve_bytes = num(&c, "device.reserve_gib", 0) * 1073741824.0;
    cl->nccl_comm_bytes = num(&c, "device.nccl_comm_gib", 0) * 1073741824.0;
    static const char *peaks[MT_PREC_COUNT] = {"device.peak_tflops_fp32", "device.peak_tflops_tf32",
                                           "device.peak_tflops_bf16", "device.peak_tflops_fp16"};
    bool any_peak = false;
    for (int p = 0; p < MT_PREC_COUNT; p++) {
        cl->peak_flops[p] = num(&c, peaks[p], 0) * 1e12;
        any_peak = any_peak || cl->peak_flops[p] > 0;
    }
    if (!any_peak) {
        report(&c, 0,
               "no device.peak_tflops_* given: set at least device.peak_tflops_fp32 (the rate the plan "
               "divides model FLOPs by)");
    }
    cl->efficiency = num(&c, "device.efficiency", 0.5);
    cl->eff_half_work = num(&c, "device.efficiency_half_work", 0);
    cl->attention_efficiency = num(&c, "device.attention_efficiency", 1.0);
    cl->mem_bw = num(&c, "device.memory_bw_gbs", 100) * 1e9;
    cl->intra.latency_s = num(&c, "links.intra.latency_us", 5) * 1e-6;
    cl->intra.bw = num(&c, "links.intra.bandwidth_gbs", 0) * 1e9;
    cl->inter.latency_s = num(&c, "links.inter.latency_us", 10) * 1e-6;
    cl->inter.bw = num(&c, "links.inter.bandwidth_gbs", 0) * 1e9;
    cl->overlap_dp = num(&c, "overlap.dp", 0);
    mt_status_t st = MT_OK;
    static const char *bench[2] = {"bench.intra_json", "bench.inter_json"};
    for (int b = 0; b < 2; b++) {
        const cval_t *v = val(&c, bench[b]);
        if (v->set) {
            char p[1024];
            relative_to(path, v->s, p, sizeof(p));
            mt_status_t bs = mt_plan_cluster_add_bench(cl, p, b == 1);
            if (bs != MT_OK) {
                report(&c, v->line, "%s: %s", bench[b], mt_last_error_msg());
                st = bs == MT_ERR_IO ? MT_ERR_IO : st;
            }
        }
    }
    bool intra_curve = false, inter_curve = false;
    for (int k = 0; k < cl->n_curves; k++) {
        intra_curve |= !cl->curves[k].inter;
        inter_curve |= cl->curves[k].inter;
    }
    if (cl->intra.bw <= 0 && !intra_curve && cl->devices_per_node > 1) {
        report(&c, 0,
               "links.intra.bandwidth_gbs is required (or bench.intra_json with measured curves) when "
               "devices_per_node > 1");
    }
    if (cl->inter.bw <= 0 && !inter_curve && cl->nodes > 1) {
        report(&c, 0,
               "links.inter.bandwidth_gbs is required (or bench.inter_json with measured curves) when "
               "nodes > 1");
    }
    for (size_t k = 0; k < NKEYS; k++) {
        free(c.vals[k].s);
    }
    if (c.n_errors > 0) {
        mt_plan_cluster_free(cl);
        return st == MT_ERR_IO ? st
                               : mt_error(MT_ERR_INVALID_ARG, "%s: %d error(s) in the cluster file", path, c.n_errors);
    }
    return MT_OK;
}

void mt_plan_cluster_free(mt_plan_cluster_t *c) {
    for (int k = 0; k < c->n_curves; k++) {
        free(c->curves[k].size);
        free(c->curves[k].time);
    }
    c->n_curves = 0;
}
