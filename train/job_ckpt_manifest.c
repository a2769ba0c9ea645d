/* The checkpoint manifest: format and version check on reading, the loss scaler's saved state, the
 * warning for optimizer state this run has no use for, and on saving the manifest itself (every tensor's
 * shards, checked to cover the tensor) and config.toml. The pieces side is job_ckpt_pieces.c; format:
 * docs/checkpoints.md.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/crc32c.h"
#include "runtime/rt.h"
#include "train/job_ckpt_impl.h"
#include "train/job_impl.h"
#include "train/job_json.h"

#define CKPT_FORMAT "meshtrain-checkpoint"
#define CKPT_VERSION 1

/* The manifest's format name and version. */
mt_status_t ckpt_check_header(const mt_json_t *man, const char *path) {
    const char *fmt = mt_json_get_str(man, "format");
    int64_t ver = 0;
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || !mt_json_get_int(man, "version", &ver)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint: %s is not a meshtrain checkpoint manifest (no \"format\": "
                        "\"%s\" or no \"version\")",
                        path, CKPT_FORMAT);
    }
    if (ver != CKPT_VERSION) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has format version %lld; this meshtrain reads version %d",
                        path, (long long)ver, CKPT_VERSION);
    }
    return MT_OK;
}

/* Reads and parses dir/manifest.json, checking the format and version. */
mt_status_t ckpt_read_manifest(const char *dir, mt_json_t **out) {
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    MT_CHECK(ckpt_slurp(path, (size_t)1 << 30, &text, &len));
    mt_status_t st = mt_json_parse(text, len, path, out);
    free(text);
    MT_CHECK(st);
    int64_t step = 0;
    st = ckpt_check_header(*out, path);
    if (st == MT_OK && (!mt_json_get_int(*out, "step", &step) || step < 0)) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has no valid \"step\"", path);
    }
    if (st != MT_OK) {
        mt_json_free(*out);
        *out = NULL;
    }
    return st;
}

/* The loss scaler's state in the manifest ("precision"): restored when both the checkpoint and this job
 * run fp16 (a checkpoint of another mode, or of a meshtrain before the field, starts from
 * precision.init_scale). A present but malformed value is refused. */
mt_status_t ckpt_read_scaler(const mt_json_t *man, const char *path, job_t *j, scaler_state_t *out) {
    const mt_json_t *p = mt_json_get(man, "precision");
    const mt_loss_scaler_t *sc = mt_job_scaler(j);
    if (!p || !sc->dynamic) {
        return MT_OK;
    }
    const char *mode = mt_json_get_str(p, "compute");
    double scale = 0.0;
    int64_t clean = 0;
    if (!mode || !mt_json_get_num(p, "loss_scale", &scale) || !mt_json_get_int(p, "clean_steps", &clean) ||
        !(scale >= sc->min_scale && scale <= sc->max_scale) || clean < 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint: %s has a malformed \"precision\" section (loss_scale must lie in [1, 2^24], "
                        "clean_steps >= 0): the manifest is damaged; resume from an older checkpoint",
                        path);
    }
    if (strcmp(mode, "fp16") != 0) {
        return MT_OK;
    }
    out->have = true;
    out->scale = (float)scale;
    out->clean = clean;
    return MT_OK;
}

/* Rank 0: a warning when the checkpoint holds optimizer state this run's optimizer has no buffer for (AdamW's
 * moments resumed under SGD; SGD's momentum under AdamW or plain SGD; state the run needs and the checkpoint
 * lacks is ckpt_fill_pieces's error): the weights and the step count resume, that state does not. */
void ckpt_warn_unused_state(const char *dir, const mt_json_t *man, const mt_optim_params_t *optim) {
    bool sgd = optim->kind == MT_OPTIM_SGD;
    bool mom = sgd && optim->momentum > 0.0f;
    static const char *const kinds[] = {"adamw.m", "adamw.v", "sgd.momentum"};
    bool used[] = {!sgd, !sgd, mom}, held[] = {false, false, false};
    const mt_json_t *tensors = mt_json_get(man, "tensors");
    for (int k = 0; tensors && tensors->kind == MT_JSON_ARRAY && k < tensors->n; k++) {
        const char *nm = mt_json_get_str(tensors->items[k], "name");
        for (size_t i = 0; nm && i < MT_ARRAY_LEN(kinds); i++) {
            size_t kl = strlen(kinds[i]);
            held[i] |= !strncmp(nm, kinds[i], kl) && nm[kl] == '/';
        }
    }
    char list[64] = "";
    for (size_t i = 0; i < MT_ARRAY_LEN(kinds); i++) {
        if (held[i] && !used[i]) {
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", list[0] ? ", " : "", kinds[i]);
        }
    }
    if (list[0]) {
        MT_WARN("checkpoint %s holds optimizer state (%s) that optimizer.kind = \"%s\"%s does not use: the weights "
                "and the step count resume, that state is left behind (resume with the optimizer.* of the "
                "checkpoint's config.toml to keep it)",
                dir, list, sgd ? "sgd" : "adamw", sgd && !mom ? " without momentum" : "");
    }
}

typedef struct {
    char tensor[MT_CKPT_NAME_MAX];
    int rank, ndim;
    long long shape[2], lo[2], hi[2], offset, bytes;
    unsigned crc;
} meta_t;

static int meta_cmp(const void *a, const void *b) {
    const meta_t *x = a, *y = b;
    int c = strcmp(x->tensor, y->tensor);
    if (c) {
        return c;
    }
    if (x->lo[0] != y->lo[0]) {
        return x->lo[0] < y->lo[0] ? -1 : 1;
    }
    if (x->lo[1] != y->lo[1]) {
        return x->lo[1] < y->lo[1] ? -1 : 1;
    }
    return x->rank - y->rank;
}

/* Rank 0: the manifest from every rank's piece lines (all[r] for rank r), written to path and synced.
 * Checks that each tensor's shards add up to the whole tensor. */
mt_status_t ckpt_write_manifest(job_t *j, const char *path, int64_t step, char **all, const int64_t *bytes) {
    size_t n = 0, cap = 256;
    meta_t *ms = malloc(cap * sizeof(*ms));
    if (!ms) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    for (int r = 0; r < j->world; r++) {
        for (char *line = all[r]; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) {
                *nl = '\0';
            }
            if (n == cap) {
                cap *= 2;
                meta_t *g = realloc(ms, cap * sizeof(*ms));
                if (!g) {
                    free(ms);
                    return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
                }
                ms = g;
            }
            meta_t *m = &ms[n];
            m->rank = r;
            if (sscanf(line, "%95s %d %lld %lld %lld %lld %lld %lld %lld %lld %u", m->tensor, &m->ndim, &m->shape[0],
                       &m->shape[1], &m->lo[0], &m->lo[1], &m->hi[0], &m->hi[1], &m->offset, &m->bytes,
                       &m->crc) == 11) {
                n++;
            }
            line = nl ? nl + 1 : line + strlen(line);
        }
    }
    qsort(ms, n, sizeof(*ms), meta_cmp);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(ms);
        return mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    }
    const mt_config_t *cfg = j->cfg;
    const mt_model_config_t *mc = mt_model_config(j->model);
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"step\": %lld,\n  \"optimizer_step\": %lld,\n",
            CKPT_FORMAT, CKPT_VERSION, (long long)step, (long long)j->engine->ckpt_get_step(j->ectx));
    const mt_loss_scaler_t *sc = mt_job_scaler(j); /* the engine's own when it scales on its device */
    fprintf(f, "  \"precision\": {\"compute\": \"%s\", \"loss_scale\": %.9g, \"clean_steps\": %lld},\n",
            mt_prec_name(j->set.prec.compute), (double)sc->scale, (long long)sc->clean_steps);
    fprintf(f,
            "  \"data\": {\"kind\": \"%s\", \"order\": \"%s\", \"next_step\": %lld, \"global_batch\": %lld, "
            "\"seq_len\": %lld},\n",
            mt_config_str(cfg, "data.kind"), mt_config_str(cfg, "data.order"), (long long)step,
            (long long)j->info.global_batch, (long long)j->info.seq_len);
    fprintf(f,
            "  \"rng\": {\"init_seed\": %llu, \"data_seed\": %lld, \"generator\": \"counter-based: values depend "
            "only on (seed, step, row, position), so the data position is next_step\"},\n",
            (unsigned long long)mc->seed, (long long)mt_config_int(cfg, "train.seed"));
    fprintf(f,
            "  \"model\": {\"kind\": \"%s\", \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"seq_len\": %d, "
            "\"vocab_size\": %d, \"padded_vocab\": %d, \"seed\": %llu, \"n_params\": %zu},\n",
            mc->kind == MT_MODEL_MLP ? "mlp" : "gpt2", mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len, mc->vocab_size,
            mc->padded_vocab, (unsigned long long)mc->seed, mt_model_numel(j->model));
    fprintf(f,
            "  \"mesh\": {\"world\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"order\": \"%s\", \"engine\": "
            "\"%s\", \"zero_stage\": %d},\n",
            j->world, j->set.par.tp, j->set.par.pp, j->info.dp_size, j->set.par.order, j->engine->name,
            j->set.par.zero_stage);
    fprintf(f, "  \"files\": [");
    for (int r = 0; r < j->world; r++) {
        fprintf(f, "%s{\"rank\": %d, \"file\": \"rank-%05d.bin\", \"bytes\": %lld}", r ? ", " : "", r, r,
                (long long)bytes[r]);
    }
    fprintf(f, "],\n  \"tensors\": [\n");
    mt_status_t st = MT_OK;
    for (size_t i = 0; i < n;) {
        size_t k = i;
        long long numel = 0;
        fprintf(f, "    {\"name\": ");
        mt_json_write_string(f, ms[i].tensor);
        if (ms[i].ndim == 2) {
            fprintf(f, ", \"dtype\": \"f32\", \"shape\": [%lld, %lld], \"shards\": [", ms[i].shape[0], ms[i].shape[1]);
        } else {
            fprintf(f, ", \"dtype\": \"f32\", \"shape\": [%lld], \"shards\": [", ms[i].shape[0]);
        }
        for (; k < n && !strcmp(ms[k].tensor, ms[i].tensor); k++) {
            const meta_t *m = &ms[k];
            if (m->ndim == 2) {
                fprintf(f, "%s\n      {\"rank\": %d, \"lo\": [%lld, %lld], \"hi\": [%lld, %lld], ", k > i ? "," : "",
                        m->rank, m->lo[0], m->lo[1], m->hi[0], m->hi[1]);
                numel += (m->hi[0] - m->lo[0]) * (m->hi[1] - m->lo[1]);
            } else {
                fprintf(f, "%s\n      {\"rank\": %d, \"lo\": [%lld], \"hi\": [%lld], ", k > i ? "," : "", m->rank,
                        m->lo[0], m->hi[0]);
                numel += m->hi[0] - m->lo[0];
            }
            fprintf(f, "\"file\": \"rank-%05d.bin\", \"offset\": %lld, \"bytes\": %lld, \"crc32c\": %u}", m->rank,
                    m->offset, m->bytes, m->crc);
        }
        long long whole = ms[i].shape[0] * (ms[i].ndim == 2 ? ms[i].shape[1] : 1);
        if (numel != whole && st == MT_OK) {
            st = mt_error(MT_ERR_INTERNAL, "checkpoint: the engine's shards of %s hold %lld of its %lld elements",
                          ms[i].tensor, numel, whole);
        }
        fprintf(f, "]}%s\n", k < n ? "," : "");
        i = k;
    }
    fprintf(f, "  ],\n  \"config\": ");
    char *ctext = NULL;
    size_t clen = 0;
    FILE *mem = open_memstream(&ctext, &clen);
    if (mem) {
        mt_config_print(cfg, mem);
        fclose(mem);
    }
    mt_json_write_string(f, ctext ? ctext : "");
    free(ctext);
    fprintf(f, "\n}\n");
    free(ms);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = st == MT_OK ? mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", path, strerror(errno)) : st;
    }
    if (fclose(f) != 0 && st == MT_OK) {
        st = mt_error(MT_ERR_IO, "checkpoint: closing %s: %s", path, strerror(errno));
    }
    return st;
}

mt_status_t ckpt_write_config(const mt_config_t *cfg, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        return mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    }
    mt_config_print(cfg, f);
    int rc = fflush(f) | fsync(fileno(f));
    rc |= fclose(f);
    return rc ? mt_error(MT_ERR_IO, "checkpoint: writing %s failed", path) : MT_OK;
}
