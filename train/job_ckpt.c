/* Checkpoints: a directory per step holding manifest.json (format version, config, mesh, step, data
 * position, RNG seeds, and for every global tensor its shape, dtype and the shards that hold it: rank,
 * box, file, offset, bytes, CRC32C), config.toml and one shard file per rank with the pieces that rank
 * owns. Tensors are described by global name, shape and boxes, so a reader under any layout assembles
 * any piece it needs from whichever shards overlap it (resharding). Writing is atomic: a temporary
 * directory, every rank fsyncs its file, rank 0 writes the manifest last, renames the directory into
 * place, then replaces `latest` with a rename; older checkpoints beyond checkpoint.keep go only after
 * that. Format and protocol: docs/checkpoints.md. This file holds set-up, resume and the save protocol;
 * job_ckpt_pieces.c reads and writes the tensor pieces, job_ckpt_manifest.c reads and writes the manifest.
 * SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/llmc.h"
#include "runtime/crc32c.h"
#include "runtime/rt.h"
#include "runtime/signals.h"
#include "runtime/trace.h"
#include "train/job_ckpt_impl.h"
#include "train/job_impl.h"
#include "train/job_json.h"

/* Test knob: the Nth checkpoint this process writes stops rank 0 with _exit(86) after every shard file
 * is written and synced but before the manifest and the rename (tests/jobs: a crash mid-save). */
MT_PARAM(ckpt_test_crash, "CKPT_TEST_CRASH", 0)

struct job_ckpt {
    char dir[1024]; /* checkpoint.dir ("" = no saving) */
    int64_t every, keep;
    char resume[1100]; /* step directory to resume from ("" = none) */
    int n_saved;
    bool on_signal;  /* handlers installed (checkpoint.on_signal with a checkpoint.dir) */
    char last[1100]; /* the last complete checkpoint written or resumed from ("" = none) */
};

/* ---- small file helpers ---------------------------------------------------------------------------- */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) {
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static mt_status_t mkdir_p(const char *path) {
    char d[1100];
    snprintf(d, sizeof(d), "%s", path);
    for (char *c = d + 1;; c++) {
        if (*c == '/' || *c == '\0') {
            char save = *c;
            *c = '\0';
            if (mkdir(d, 0755) != 0 && errno != EEXIST) {
                return mt_error(MT_ERR_IO, "checkpoint.dir: cannot create %s: %s", d, strerror(errno));
            }
            *c = save;
            if (!save) {
                break;
            }
        }
    }
    return MT_OK;
}

static mt_status_t fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return mt_error(MT_ERR_IO, "checkpoint: cannot open %s to sync it: %s", path, strerror(errno));
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) { /* some file systems cannot fsync directories */
        return mt_error(MT_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(e));
    }
    return MT_OK;
}

/* Reads a whole small file (manifest, latest) into a NUL-terminated buffer; at most max bytes. */
mt_status_t ckpt_slurp(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: cannot read %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || sb.st_size < 0 || (size_t)sb.st_size > max) {
        fclose(f);
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s is %lld bytes, more than the %zu a manifest may have", path,
                        (long long)sb.st_size, max);
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        fclose(f);
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, (size_t)sb.st_size, f);
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MT_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* path is a step directory (has manifest.json) or a checkpoint.dir (has latest): the step directory. */
static mt_status_t resolve(const char *path, char *out, size_t len, const char *what) {
    char m[1200];
    snprintf(m, sizeof(m), "%s/manifest.json", path);
    if (exists(m)) {
        snprintf(out, len, "%s", path);
        return MT_OK;
    }
    char l[1200];
    snprintf(l, sizeof(l), "%s/latest", path);
    if (!exists(l)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s = \"%s\": neither a checkpoint (no manifest.json) nor a checkpoint directory (no "
                        "`latest`)%s",
                        what, path, is_dir(path) ? "" : "; it does not exist");
    }
    char *text = NULL;
    size_t n = 0;
    MT_CHECK(ckpt_slurp(l, 4096, &text, &n));
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) {
        text[--n] = '\0';
    }
    if (n == 0 || strchr(text, '/')) {
        mt_status_t st =
            mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s does not name a step directory (\"%s\")", l, text);
        free(text);
        return st;
    }
    snprintf(out, len, "%s/%s", path, text);
    free(text);
    snprintf(m, sizeof(m), "%s/manifest.json", out);
    if (!exists(m)) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s points to %s, which has no manifest.json", l, out);
    }
    return MT_OK;
}

mt_status_t mt_job_ckpt_read_model(const char *path, mt_model_t *model, mt_config_t **cfg_out, char *from,
                                   size_t from_len) {
    *model = NULL;
    if (cfg_out) {
        *cfg_out = NULL;
    }
    char dir[1100];
    MT_CHECK(resolve(path, dir, sizeof(dir), "checkpoint"));
    if (from) {
        snprintf(from, from_len, "%s", dir);
    }
    mt_json_t *man = NULL;
    MT_CHECK(ckpt_read_manifest(dir, &man));
    const mt_json_t *mj = mt_json_get(man, "model");
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    int64_t v[7];
    const char *keys[7] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "padded_vocab", "seed"};
    const char *kind = mt_json_get_str(mj, "kind");
    bool ok = kind != NULL;
    for (int k = 0; k < 7 && ok; k++) {
        ok = mt_json_get_int(mj, keys[k], &v[k]) && v[k] >= 0 && v[k] < (INT64_C(1) << 31);
    }
    mt_status_t st = MT_OK;
    if (!ok) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: the manifest's \"model\" section is missing or malformed",
                      dir);
    }
    if (st == MT_OK) {
        mc.kind = strcmp(kind, "mlp") ? MT_MODEL_GPT2 : MT_MODEL_MLP;
        mc.n_layer = (int)v[0];
        mc.n_head = (int)v[1];
        mc.n_embd = (int)v[2];
        mc.seq_len = (int)v[3];
        mc.vocab_size = (int)v[4];
        mc.padded_vocab = (int)v[5];
        mc.seed = (uint64_t)v[6];
        st = mt_model_init(&mc, model); /* registers shapes, allocates no storage */
    }
    mt_ckpt_piece_t *pc = NULL;
    int np = *model ? mt_model_n_params(*model) : 0;
    if (st == MT_OK) {
        pc = calloc((size_t)MT_MAX(np, 1), sizeof(*pc));
        st = pc ? MT_OK : mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    for (int i = 0; i < np && st == MT_OK; i++) {
        mt_param_t *p = mt_model_param(*model, i);
        snprintf(pc[i].tensor, sizeof(pc[i].tensor), "param/%s", p->name);
        pc[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) {
            pc[i].shape[d] = p->global_shape[d];
            pc[i].hi[d] = p->global_shape[d];
        }
    }
    if (st == MT_OK) { /* sizes first: nothing is allocated from a manifest that disagrees with its files */
        st = ckpt_check_sizes(dir, man, pc, np, mc.vocab_size);
    }
    if (st == MT_OK) {
        int64_t have = 0, f = 0;
        const mt_json_t *files = mt_json_get(man, "files");
        for (int k = 0; files && k < files->n; k++) {
            have += mt_json_get_int(files->items[k], "bytes", &f) ? f : 0;
        }
        size_t need = mt_model_numel(*model) * sizeof(float);
        if ((uint64_t)need > (uint64_t)have) {
            st = mt_error(MT_ERR_INVALID_ARG,
                          "checkpoint %s: its \"model\" section describes %zu bytes of parameters but its shard files "
                          "hold %lld bytes in all: the manifest is damaged; use another checkpoint",
                          dir, need, (long long)have);
        }
    }
    if (st == MT_OK) {
        st = mt_model_alloc_params(*model);
    }
    for (int i = 0; i < np && st == MT_OK; i++) {
        pc[i].data = mt_model_param(*model, i)->data;
    }
    if (st == MT_OK) {
        st = ckpt_fill_pieces(dir, man, pc, np, mc.vocab_size);
    }
    if (st == MT_OK && cfg_out) {
        char cp[1200];
        snprintf(cp, sizeof(cp), "%s/config.toml", dir);
        st = mt_config_load(cp, 0, NULL, 0, cfg_out, stderr);
    }
    free(pc);
    mt_json_free(man);
    if (st != MT_OK) {
        mt_model_free(*model);
        *model = NULL;
    }
    return st;
}

/* ---- set-up and resume ----------------------------------------------------------------------------- */

mt_status_t mt_job_ckpt_init(job_t *j, job_ckpt_t **out) {
    *out = NULL;
    const mt_config_t *cfg = j->cfg;
    const char *dir = mt_config_str(cfg, "checkpoint.dir"), *resume = mt_config_str(cfg, "checkpoint.resume");
    bool resume_path = strcmp(resume, "auto") != 0 && strcmp(resume, "none") != 0 && resume[0];
    if (!dir[0] && !resume_path) {
        return MT_OK;
    }
    if (!j->engine->ckpt_pieces || !j->engine->ckpt_get_step || !j->engine->ckpt_set_step) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint.dir / checkpoint.resume: the engine \"%s\" cannot write or read checkpoints "
                        "(unset checkpoint.dir)",
                        j->engine->name);
    }
    job_ckpt_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    *out = c;
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    if (dir[0] && mt_config_bool(cfg, "checkpoint.on_signal")) {
        MT_CHECK(mt_signals_install()); /* SIGTERM, SIGINT, SIGUSR1: runtime/signals.h */
        c->on_signal = true;
    }
    c->every = mt_config_int(cfg, "checkpoint.every");
    c->keep = mt_config_int(cfg, "checkpoint.keep");
    /* rank 0 decides what to resume from; everyone gets its verdict */
    mt_status_t st = MT_OK;
    char msg[1024] = "";
    if (j->rank == 0 && dir[0]) { /* a directory that cannot take checkpoints is found now, not after training */
        st = mkdir_p(dir) == MT_OK ? MT_OK : MT_ERR_INVALID_ARG; /* bad input: the message names the path */
        if (st == MT_OK && (!is_dir(dir) || access(dir, W_OK | X_OK) != 0)) {
            st = mt_error(MT_ERR_INVALID_ARG, "checkpoint.dir = \"%s\" is not a writable directory (%s)", dir,
                          is_dir(dir) ? strerror(errno) : "a file is in the way");
        }
    }
    if (j->rank == 0 && st == MT_OK) {
        if (resume_path) {
            st = resolve(resume, c->resume, sizeof(c->resume), "checkpoint.resume");
        } else if (!strcmp(resume, "auto") && dir[0]) {
            char l[1100];
            snprintf(l, sizeof(l), "%s/latest", dir);
            if (exists(l)) {
                st = resolve(dir, c->resume, sizeof(c->resume), "checkpoint.dir");
            }
        }
    }
    if (j->rank == 0 && st != MT_OK) {
        snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
    }
    int sti = (int)st;
    MT_CHECK(mt_job_bcast(&j->sync, "resume_verdict", &sti, 1, MPI_INT, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "resume_message", msg, (int)sizeof(msg), MPI_CHAR, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "resume_path", c->resume, (int)sizeof(c->resume), MPI_CHAR, 0));
    if (sti != MT_OK) {
        return mt_error((mt_status_t)sti, "%s", msg);
    }
    return MT_OK;
}

mt_status_t mt_job_ckpt_resume(job_ckpt_t *c, job_t *j) {
    if (!c || !c->resume[0]) {
        return MT_OK;
    }
    /* rank 0 reads the manifest and broadcasts it, so ranks agree on it even while it is being replaced */
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/manifest.json", c->resume);
    mt_status_t st = MT_OK;
    char msg[1024] = "";
    if (j->rank == 0) {
        st = ckpt_slurp(path, (size_t)1 << 30, &text, &len);
        if (st != MT_OK) {
            snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
        }
    }
    int64_t l64 = st == MT_OK ? (int64_t)len : -1;
    MT_CHECK(mt_job_bcast(&j->sync, "manifest_length", &l64, 1, MPI_INT64_T, 0));
    if (l64 < 0) {
        MT_CHECK(mt_job_bcast(&j->sync, "manifest_message", msg, (int)sizeof(msg), MPI_CHAR, 0));
        free(text);
        return mt_error(MT_ERR_INVALID_ARG, "%s", msg);
    }
    mt_status_t ast = MT_OK;
    if (j->rank != 0) {
        text = malloc((size_t)l64 + 1);
        if (!text) {
            ast = mt_error(MT_ERR_OOM, "checkpoint: out of memory for the manifest (%lld bytes)", (long long)l64);
        } else {
            text[l64] = '\0';
        }
    }
    st = mt_job_agree(&j->sync, "manifest_alloc", ast); /* no rank may skip the broadcast below alone */
    if (st != MT_OK) {
        free(text);
        return st;
    }
    MT_CHECK(mt_job_bcast(&j->sync, "manifest", text, (int)l64, MPI_CHAR, 0)); /* manifests stay far below 2 GiB */
    mt_json_t *man = NULL;
    st = mt_json_parse(text, (size_t)l64, path, &man);
    free(text);
    MT_CHECK(st);
    int64_t step = 0, ostep = 0;
    st = ckpt_check_header(man, path);
    if (st == MT_OK && (!mt_json_get_int(man, "step", &step) || !mt_json_get_int(man, "optimizer_step", &ostep) ||
                        step < 0 || ostep < 0)) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has no valid \"step\" or \"optimizer_step\"", path);
    } else if (st == MT_OK && step > mt_config_int(j->cfg, "train.steps")) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "checkpoint %s was written after step %lld, beyond train.steps = %lld (raise train.steps or "
                      "set checkpoint.resume = \"none\")",
                      c->resume, (long long)step, (long long)mt_config_int(j->cfg, "train.steps"));
    }
    scaler_state_t ps = {0};
    if (st == MT_OK) {
        st = ckpt_read_scaler(man, path, j, &ps);
    }
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    if (st == MT_OK) {
        st = j->engine->ckpt_pieces(j->ectx, false, &pc, &n);
    }
    if (st == MT_OK) { /* every size the manifest states, against the model and the files, before reading */
        st = ckpt_check_sizes(c->resume, man, pc, n, mt_model_config(j->model)->vocab_size);
    }
    if (st == MT_OK) {
        st = ckpt_fill_pieces(c->resume, man, pc, n, mt_model_config(j->model)->vocab_size);
    }
    if (st == MT_OK && j->rank == 0) {
        ckpt_warn_unused_state(c->resume, man, &j->set.optim);
    }
    free(pc);
    mt_json_free(man);
    MT_CHECK(st);
    j->engine->ckpt_set_step(j->ectx, ostep);
    if (ps.have) { /* fp16 continues with the scale and clean-step count it stopped with */
        mt_loss_scaler_t *sc = mt_job_scaler(j); /* the engine's own when it scales on its device */
        sc->scale = ps.scale;
        sc->clean_steps = ps.clean;
    }
    if (j->engine->ckpt_loaded) {
        MT_CHECK(j->engine->ckpt_loaded(j->ectx));
    }
    j->start_step = step;
    return MT_OK;
}

const char *mt_job_ckpt_resumed_from(const job_ckpt_t *c) {
    return c && c->resume[0] ? c->resume : NULL;
}

mt_status_t mt_job_init_llmc(job_t *j) {
    if (!j->info.init_llmc || !j->engine->ckpt_pieces) {
        return MT_OK;
    }
    /* the whole model in the file's shape, read by every rank; each rank copies the boxes it holds */
    mt_model_config_t mc = *mt_model_config(j->model);
    mc.tp_rank = 0;
    mc.tp_size = 1;
    mc.tp_ops = NULL;
    mt_llmc_header_t h;
    MT_CHECK(mt_llmc_read_header(j->info.init_llmc, &h));
    MT_CHECK(mt_llmc_apply_header(&h, j->info.init_llmc, 0, &mc));
    mt_model_t whole = NULL;
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    mt_status_t st = mt_model_init(&mc, &whole);
    if (st == MT_OK) {
        st = mt_model_alloc_params(whole);
    }
    if (st == MT_OK) {
        st = mt_llmc_load(whole, j->info.init_llmc);
    }
    if (st == MT_OK) {
        st = j->engine->ckpt_pieces(j->ectx, false, &pc, &n);
    }
    for (int i = 0; i < n && st == MT_OK; i++) {
        if (strncmp(pc[i].tensor, "param/", 6) != 0) {
            continue; /* optimizer state starts at zero */
        }
        int k = mt_model_find_param(whole, pc[i].tensor + 6);
        const mt_param_t *p = k >= 0 ? mt_model_param(whole, k) : NULL;
        if (!p || p->ndim != pc[i].ndim || (p->ndim == 2 && p->global_shape[1] != pc[i].shape[1])) {
            st = mt_error(MT_ERR_INTERNAL, "model.init: %s has no counterpart in the llm.c model", pc[i].tensor);
            break;
        }
        /* rows beyond the file's (padding when tensor parallelism pads the vocabulary further) are zero */
        int64_t rows = p->global_shape[0];
        if (pc[i].ndim == 2) {
            ckpt_zero_rows(&pc[i], rows, pc[i].hi[0]);
        } else if (pc[i].hi[0] > rows) {
            memset(pc[i].data + MT_MAX(rows - pc[i].lo[0], 0), 0,
                   (size_t)(pc[i].hi[0] - MT_MAX(rows, pc[i].lo[0])) * sizeof(float));
        }
        int64_t lo[2] = {0, 0}, hi[2] = {rows, p->ndim == 2 ? p->global_shape[1] : 1};
        ckpt_copy_overlap(pc[i].ndim, lo, hi, p->data, pc[i].lo, pc[i].hi, pc[i].data, pc[i].ld);
    }
    free(pc);
    mt_model_free(whole);
    MT_CHECK(st);
    return j->engine->ckpt_loaded ? j->engine->ckpt_loaded(j->ectx) : MT_OK;
}

const char *mt_job_ckpt_last(const job_ckpt_t *c) {
    if (!c) {
        return "";
    }
    return c->last[0] ? c->last : c->resume;
}

void mt_job_ckpt_free(job_ckpt_t *c) {
    if (c && c->on_signal) {
        mt_signals_restore();
    }
    free(c);
}

static int64_t step_of(const char *name) {
    long long s = -1;
    char tail = 0;
    if (sscanf(name, "step-%lld%c", &s, &tail) != 1) {
        return -1;
    }
    return s;
}

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Rank 0, after the new checkpoint is complete: removes step directories beyond the keep newest and any
 * temporary directories left by crashed saves. */
static void prune(const char *dir, int64_t keep, int64_t newest) {
    DIR *d = opendir(dir);
    if (!d) {
        return;
    }
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = step_of(e->d_name);
        if (s >= 0 && n < (int)MT_ARRAY_LEN(steps)) {
            steps[n++] = s;
        } else if (!strncmp(e->d_name, ".tmp-step-", 10) || !strncmp(e->d_name, ".old-step-", 10)) {
            char p[2200];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            rm_rf(p);
        }
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(int64_t), cmp_i64_desc);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (steps[i] == newest || kept < keep) {
            kept++;
            continue;
        }
        char p[1200];
        snprintf(p, sizeof(p), "%s/step-%08lld", dir, (long long)steps[i]);
        rm_rf(p);
    }
}

static mt_status_t agree_st(job_t *j, mt_status_t st) {
    int mine = (int)st, worst = 0;
    MT_CHECK(mt_job_allreduce(&j->sync, "ckpt_agree", &mine, &worst, 1, MPI_INT, MPI_MAX));
    if (st == MT_OK && worst != MT_OK) {
        return mt_error((mt_status_t)worst, "checkpoint: another rank failed (its message is above)");
    }
    return st;
}

static mt_status_t save(job_ckpt_t *c, job_t *j, int64_t step) {
    double t0 = mt_now();
    char final[1100], tmp[1100], name[64];
    snprintf(name, sizeof(name), "step-%08lld", (long long)step);
    snprintf(final, sizeof(final), "%s/%s", c->dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.tmp-%s", c->dir, name);
    mt_status_t st = MT_OK;
    if (j->rank == 0) {
        st = mkdir_p(c->dir);
        if (st == MT_OK) {
            rm_rf(tmp);
            if (mkdir(tmp, 0755) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
            }
        }
    }
    MT_CHECK(agree_st(j, st));
    /* every rank: its shard file */
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    char *meta = NULL;
    size_t meta_len = 0;
    int64_t total = 0;
    char file[1200];
    snprintf(file, sizeof(file), "%s/rank-%05d.bin", tmp, j->rank);
    st = j->engine->ckpt_pieces(j->ectx, true, &pc, &n);
    if (st == MT_OK) {
        st = ckpt_write_shard(file, pc, n, &meta, &meta_len, &total);
    }
    free(pc);
    st = agree_st(j, st);
    if (st != MT_OK) {
        free(meta);
        return st;
    }
    c->n_saved++;
    if (mt_param_ckpt_test_crash() == c->n_saved && j->rank == 0) {
        fprintf(stderr,
                "meshtrain: MESHTRAIN_CKPT_TEST_CRASH: stopping in the middle of checkpoint %s (shard files "
                "written, no manifest)\n",
                name);
        fflush(stderr);
        _exit(86);
    }
    /* gather every rank's piece lines and byte counts on rank 0 */
    int len = (int)meta_len, *lens = NULL, *displs = NULL;
    int64_t *bytes = NULL;
    char *all = NULL, **per = NULL;
    if (j->rank == 0) {
        lens = calloc((size_t)j->world, sizeof(int));
        displs = calloc((size_t)j->world, sizeof(int));
        bytes = calloc((size_t)j->world, sizeof(int64_t));
        per = calloc((size_t)j->world, sizeof(char *));
    }
    st = mt_job_gather(&j->sync, "ckpt_meta_lengths", &len, 1, MPI_INT, lens, 0);
    if (st == MT_OK) {
        st = mt_job_gather(&j->sync, "ckpt_shard_bytes", &total, 1, MPI_INT64_T, bytes, 0);
    }
    size_t sum = 0;
    if (j->rank == 0) {
        for (int r = 0; r < j->world; r++) {
            displs[r] = (int)sum;
            sum += (size_t)lens[r] + 1;
        }
        all = calloc(sum + 1, 1);
    }
    if (st == MT_OK) {
        st = mt_job_gatherv(&j->sync, "ckpt_meta", meta, len, MPI_CHAR, all, lens, displs, 0);
    }
    free(meta);
    if (j->rank == 0) {
        for (int r = 0; r < j->world; r++) {
            per[r] = all + displs[r];
            per[r][lens[r]] = '\0'; /* the extra byte after each rank's text */
        }
        char path[1200];
        snprintf(path, sizeof(path), "%s/config.toml", tmp);
        st = st == MT_OK ? ckpt_write_config(j->cfg, path) : st; /* nothing is written after a failed gather */
        if (st == MT_OK) {
            snprintf(path, sizeof(path), "%s/manifest.json", tmp);
            st = ckpt_write_manifest(j, path, step, per, bytes); /* the manifest is the last file written */
        }
        if (st == MT_OK) {
            st = fsync_path(tmp);
        }
        if (st == MT_OK && exists(final)) {
            /* The same step written before (a fresh run over an old directory): swap the two directories in
             * one step, so `latest`, which may name this step, never points at a missing directory; the old
             * one (now under the temporary name) is removed by prune. Without RENAME_EXCHANGE (old kernels,
             * some file systems) the old one is moved aside first. */
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
                char old[1200];
                snprintf(old, sizeof(old), "%s/.old-%s", c->dir, name);
                rm_rf(old);
                if (rename(final, old) != 0 || rename(tmp, final) != 0) {
                    st = mt_error(MT_ERR_IO, "checkpoint: replacing %s failed: %s", final, strerror(errno));
                }
            }
        } else if (st == MT_OK && rename(tmp, final) != 0) {
            st = mt_error(MT_ERR_IO, "checkpoint: rename %s -> %s: %s", tmp, final, strerror(errno));
        }
        if (st == MT_OK) {
            st = fsync_path(c->dir);
        }
        if (st == MT_OK) { /* latest: written aside, synced, renamed over the old pointer */
            char lt[1200], lp[1200];
            snprintf(lt, sizeof(lt), "%s/latest.tmp", c->dir);
            snprintf(lp, sizeof(lp), "%s/latest", c->dir);
            FILE *f = fopen(lt, "w");
            if (!f || fprintf(f, "%s\n", name) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", lt, strerror(errno));
            }
            if (f && fclose(f) != 0 && st == MT_OK) {
                st = mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", lt, strerror(errno));
            }
            if (st == MT_OK && rename(lt, lp) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: rename %s -> %s: %s", lt, lp, strerror(errno));
            }
            if (st == MT_OK) {
                st = fsync_path(c->dir);
            }
        }
        if (st == MT_OK) {
            prune(c->dir, c->keep, step);
        }
        if (st == MT_OK && j->out) {
            int64_t b = 0;
            for (int r = 0; r < j->world; r++) {
                b += bytes[r];
            }
            fprintf(j->out, "checkpoint: step %lld written to %s (%.1f MiB in %d shard file%s, %.2f s)\n",
                    (long long)step, final, (double)b / (1024.0 * 1024.0), j->world, j->world == 1 ? "" : "s",
                    mt_now() - t0);
            fflush(j->out);
        }
        free(lens);
        free(displs);
        free(bytes);
        free(per);
        free(all);
    }
    return agree_st(j, st);
}

mt_status_t mt_job_ckpt_after_step(job_ckpt_t *c, job_t *j, int64_t s, bool last) {
    if (!c || !c->dir[0]) {
        return MT_OK;
    }
    int sig = 0;
    if (c->on_signal) { /* every rank learns of a signal any rank got, at the same step */
        uint64_t call = mt_job_sync_begin(&j->sync, "signal_agree", sizeof(int)); /* watched (job_sync.c) */
        mt_status_t st = mt_signals_agree(j->comm, &sig);
        mt_job_sync_end(&j->sync, call);
        MT_CHECK(st);
    }
    if (!last && !sig && (c->every <= 0 || (s + 1) % c->every != 0)) {
        return MT_OK;
    }
    MT_TRACE_BEGIN(t_ck);
    mt_status_t st = save(c, j, s + 1);
    MT_TRACE_END(t_ck, "checkpoint", "checkpoint");
    if (st == MT_OK) {
        snprintf(c->last, sizeof(c->last), "%s/step-%08lld", c->dir, (long long)s + 1);
    }
    if (st == MT_OK && sig && !last) {
        j->stop_signal = sig;
        return mt_error(MT_ERR_SYSTEM,
                        "stopped by %s after step %lld; checkpoint %s/step-%08lld written: run the same command "
                        "again to resume (checkpoint.resume = \"auto\")",
                        sig == SIGTERM  ? "SIGTERM"
                        : sig == SIGINT ? "SIGINT"
                                        : "a signal",
                        (long long)s + 1, c->dir, (long long)s + 1);
    }
    return st;
}
