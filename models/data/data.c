/* The loader: which tokens make up step s's global batch (random windows keyed by (seed, step, row),
 * llm.c-style sequential windows, or the synthetic Markov chain), this rank's slice of it, and a
 * background thread that loads step s+1 while step s computes.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "runtime/alloc.h"

/* The chain of the synthetic source is fixed: the same for every run and every train.seed. */
#define SYNTH_CHAIN_SEED 0x6d6573687472616eull /* "meshtran" */

typedef struct {
    char *path;
    int fd;
    int64_t n_tokens;
    int64_t first_rand;  /* random order: index of this shard's first window start over all shards */
    int64_t first_seq;   /* sequential order: index of this shard's first B*T+1 window over all shards */
    int64_t n_seq;       /* sequential windows in this shard: floor((n - 1) / (B*T)) */
} shard_t;

typedef struct {
    mt_batch_t b;
    int32_t *rows; /* (rows, T + 1) scratch */
} batch_buf_t;

struct mt_data {
    mt_data_params_t p;
    char what[64];
    int n_shards;
    shard_t *shards;
    int64_t n_tokens;
    int64_t n_rand; /* random order: window starts over all shards */
    int64_t n_seq;  /* sequential order: windows per cycle */
    int k;          /* synthetic: successors per token */
    int32_t *succ;  /* synthetic: (vocab_size, k) */

    batch_buf_t cur, next;
    int64_t hits, misses;

    /* prefetch thread: `next` belongs to the worker while busy */
    bool thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy, quit;
    int64_t next_step; /* step being or last loaded into next; -1 none */
    mt_status_t next_st;
    char next_err[512];
};

bool mt_data_kind_parse(const char *s, mt_data_kind_t *out) {
    if (s && !strcmp(s, "synthetic")) {
        *out = MT_DATA_SYNTHETIC;
        return true;
    }
    if (s && !strcmp(s, "shards")) {
        *out = MT_DATA_SHARDS;
        return true;
    }
    return false;
}

bool mt_data_order_parse(const char *s, mt_data_order_t *out) {
    if (s && !strcmp(s, "random")) {
        *out = MT_DATA_RANDOM;
        return true;
    }
    if (s && !strcmp(s, "sequential")) {
        *out = MT_DATA_SEQUENTIAL;
        return true;
    }
    return false;
}

/* ---- counter-based hashing ------------------------------------------------------------------- */

/* splitmix64's finaliser: a bijection on 64 bits with full avalanche. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t key5(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e) {
    return mix64(mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d) ^ e);
}

double mt_synth_entropy(int64_t vocab_size) {
    return log((double)MT_MIN((int64_t)MT_SYNTH_BRANCH, vocab_size));
}

static mt_status_t synth_init(struct mt_data *d) {
    int64_t v = d->p.vocab_size;
    d->k = (int)MT_MIN((int64_t)MT_SYNTH_BRANCH, v);
    d->succ = mt_alloc((size_t)v * (size_t)d->k * sizeof(int32_t), MT_MEM_OTHER, "data.synth_chain");
    if (!d->succ) {
        return mt_error(MT_ERR_OOM, "%s: synthetic chain for vocab_size %lld: out of memory", d->what, (long long)v);
    }
    for (int64_t s = 0; s < v; s++) {
        int32_t *row = d->succ + s * d->k;
        uint64_t attempt = 0;
        for (int j = 0; j < d->k;) {
            int32_t c = (int32_t)(key5(SYNTH_CHAIN_SEED, (uint64_t)s, attempt++, 0, 0) % (uint64_t)v);
            bool dup = false;
            for (int i = 0; i < j; i++) {
                dup |= row[i] == c;
            }
            if (!dup) {
                row[j++] = c;
            }
        }
    }
    return MT_OK;
}

int mt_synth_successors(mt_data_t d, int64_t s, int32_t *succ) {
    if (!d->succ || s < 0 || s >= d->p.vocab_size) {
        return 0;
    }
    memcpy(succ, d->succ + s * d->k, (size_t)d->k * sizeof(int32_t));
    return d->k;
}

/* Row `row` of step `step`: T + 1 tokens of the chain from a uniformly drawn start. */
static void synth_row(const struct mt_data *d, int64_t step, int64_t row, int32_t *out) {
    uint64_t seed = d->p.seed, split = (uint64_t)d->p.split + 1;
    uint64_t base = key5(seed, split, (uint64_t)step, (uint64_t)row, 0x5157u);
    int32_t x = (int32_t)(mix64(base) % (uint64_t)d->p.vocab_size);
    out[0] = x;
    for (int64_t t = 1; t <= d->p.seq_len; t++) {
        uint64_t h = mix64(base ^ mix64((uint64_t)t));
        x = d->succ[(int64_t)x * d->k + (int64_t)(h % (uint64_t)d->k)];
        out[t] = x;
    }
}

/* ---- shards ---------------------------------------------------------------------------------- */

static mt_status_t read_tokens(const shard_t *s, int64_t pos, int64_t n, int32_t *out) {
    uint16_t buf[4096];
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        int64_t m = MT_MIN((int64_t)4096, n - i0);
        size_t want = (size_t)m * 2;
        off_t off = MT_SHARD_HEADER_BYTES + 2 * (pos + i0);
        char *p = (char *)buf;
        while (want > 0) {
            ssize_t r = pread(s->fd, p, want, off);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                return mt_error(MT_ERR_IO, "%s: read of %lld tokens at %lld failed: %s (file changed while training?)",
                                s->path, (long long)n, (long long)pos, r < 0 ? strerror(errno) : "end of file");
            }
            p += r;
            off += r;
            want -= (size_t)r;
        }
        for (int64_t i = 0; i < m; i++) {
            out[i0 + i] = buf[i];
        }
    }
    return MT_OK;
}

/* Largest i with first[i] <= idx (first sorted ascending, first[0] = 0). */
static int find_shard(const struct mt_data *d, int64_t idx, bool seq) {
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        int64_t f = seq ? d->shards[mid].first_seq : d->shards[mid].first_rand;
        if (f <= idx) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    /* Shards without windows share their first index with the next shard, so the largest such i is
     * always a shard that has windows. */
    return lo;
}

mt_status_t mt_data_global_rows(mt_data_t d, int64_t step, int64_t row0, int64_t n, int32_t *out) {
    int64_t T = d->p.seq_len, B = d->p.global_batch;
    if (step < 0 || row0 < 0 || row0 + n > B) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: rows [%lld, %lld) of step %lld outside the batch of %lld", d->what,
                        (long long)row0, (long long)(row0 + n), (long long)step, (long long)B);
    }
    for (int64_t r = 0; r < n; r++) {
        int32_t *dst = out + r * (T + 1);
        int64_t row = row0 + r;
        if (d->p.kind == MT_DATA_SYNTHETIC) {
            synth_row(d, step, row, dst);
        } else if (d->p.order == MT_DATA_RANDOM) {
            /* a window start drawn uniformly over every position with T + 1 tokens after it, any shard */
            uint64_t h = key5(d->p.seed, (uint64_t)d->p.split + 1, (uint64_t)step, (uint64_t)row, 0x7a4du);
            int64_t idx = (int64_t)(h % (uint64_t)d->n_rand);
            int si = find_shard(d, idx, false);
            MT_CHECK(read_tokens(&d->shards[si], idx - d->shards[si].first_rand, T + 1, dst));
        } else {
            /* the step's window of B*T + 1 tokens; row b is its tokens [b*T, b*T + T + 1) */
            int64_t w = step % d->n_seq;
            int si = find_shard(d, w, true);
            int64_t off = (w - d->shards[si].first_seq) * B * T;
            MT_CHECK(read_tokens(&d->shards[si], off + row * T, T + 1, dst));
        }
    }
    return MT_OK;
}

static mt_status_t open_shards(struct mt_data *d) {
    const char *pat = d->p.glob;
    if (!pat || !*pat) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s is empty: set it to a glob of llm.c token shards (e.g. \"data/train_*.bin\") or use "
                        "data.kind = \"synthetic\"",
                        d->what);
    }
    glob_t g;
    int rc = glob(pat, 0, NULL, &g); /* an unreadable or missing directory matches nothing */
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return mt_error(MT_ERR_INVALID_ARG, "%s = \"%s\": no file matches this glob (check the path)", d->what, pat);
    }
    if (rc != 0) {
        globfree(&g);
        return mt_error(MT_ERR_IO, "%s = \"%s\": cannot expand the glob (%s)", d->what, pat,
                        rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    mt_status_t st = MT_OK;
    d->shards = calloc(g.gl_pathc, sizeof(shard_t));
    if (!d->shards) {
        globfree(&g);
        return mt_error(MT_ERR_OOM, "%s: out of memory", d->what);
    }
    int64_t T = d->p.seq_len, BT = d->p.global_batch * d->p.seq_len, largest = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        shard_t *s = &d->shards[d->n_shards];
        s->fd = -1;
        int64_t n = 0;
        mt_status_t cst = mt_shard_check(g.gl_pathv[i], d->p.vocab_size, &n);
        if (cst != MT_OK) {
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
            st = mt_error(cst, "%s: %s", d->what, msg);
            break;
        }
        s->path = strdup(g.gl_pathv[i]);
        s->fd = open(g.gl_pathv[i], O_RDONLY);
        if (!s->path || s->fd < 0) {
            st = mt_error(MT_ERR_IO, "%s: cannot open %s: %s", d->what, g.gl_pathv[i], strerror(errno));
            d->n_shards++;
            break;
        }
        s->n_tokens = n;
        s->first_rand = d->n_rand;
        s->first_seq = d->n_seq;
        s->n_seq = n >= 1 ? (n - 1) / BT : 0;
        d->n_rand += MT_MAX(n - T, (int64_t)0);
        d->n_seq += s->n_seq;
        d->n_tokens += n;
        largest = MT_MAX(largest, n);
        d->n_shards++;
    }
    globfree(&g);
    if (st != MT_OK) {
        return st;
    }
    if (d->p.order == MT_DATA_RANDOM && d->n_rand == 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s: no shard holds a sequence of seq_len + 1 = %lld tokens (largest has %lld): too little "
                        "data for model.seq_len",
                        d->what, (long long)(T + 1), (long long)largest);
    }
    if (d->p.order == MT_DATA_SEQUENTIAL) {
        if (d->n_seq == 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "%s: no shard holds one batch window of global_batch x seq_len + 1 = %lld tokens (largest "
                            "has %lld): use more data, a smaller batch, or data.order = \"random\"",
                            d->what, (long long)(BT + 1), (long long)largest);
        }
        for (int i = 0; i < d->n_shards; i++) {
            if (d->shards[i].n_seq == 0) {
                MT_WARN("%s: %s has %lld tokens, fewer than one batch window of %lld: sequential order skips it",
                        d->what, d->shards[i].path, (long long)d->shards[i].n_tokens, (long long)(BT + 1));
            }
        }
    }
    return MT_OK;
}

/* ---- batches and the prefetch thread --------------------------------------------------------- */

static mt_status_t batch_alloc(struct mt_data *d, batch_buf_t *bb) {
    int64_t rows = d->p.global_batch / d->p.dp_size, T = d->p.seq_len;
    bb->b.rows = rows;
    bb->b.seq_len = T;
    bb->b.step = -1;
    bb->b.inputs = mt_alloc((size_t)(rows * T) * sizeof(int32_t), MT_MEM_OTHER, "data.inputs");
    bb->b.targets = mt_alloc((size_t)(rows * T) * sizeof(int32_t), MT_MEM_OTHER, "data.targets");
    bb->rows = mt_alloc((size_t)(rows * (T + 1)) * sizeof(int32_t), MT_MEM_OTHER, "data.rows");
    if (!bb->b.inputs || !bb->b.targets || !bb->rows) {
        return mt_error(MT_ERR_OOM, "%s: batch buffers of %lld x %lld tokens: out of memory", d->what,
                        (long long)rows, (long long)T);
    }
    return MT_OK;
}

static void batch_free(batch_buf_t *bb) {
    mt_free(bb->b.inputs);
    mt_free(bb->b.targets);
    mt_free(bb->rows);
}

/* Loads this rank's slice of step's global batch into bb. */
static mt_status_t batch_load(struct mt_data *d, int64_t step, batch_buf_t *bb) {
    int64_t rows = bb->b.rows, T = bb->b.seq_len;
    bb->b.step = -1;
    MT_CHECK(mt_data_global_rows(d, step, (int64_t)d->p.dp_rank * rows, rows, bb->rows));
    for (int64_t r = 0; r < rows; r++) {
        memcpy(bb->b.inputs + r * T, bb->rows + r * (T + 1), (size_t)T * sizeof(int32_t));
        memcpy(bb->b.targets + r * T, bb->rows + r * (T + 1) + 1, (size_t)T * sizeof(int32_t));
    }
    bb->b.step = step;
    return MT_OK;
}

static void *prefetch_main(void *arg) {
    struct mt_data *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->busy && !d->quit) {
            pthread_cond_wait(&d->cv, &d->mu);
        }
        if (d->quit) {
            break;
        }
        int64_t step = d->next_step;
        pthread_mutex_unlock(&d->mu);
        mt_status_t st = batch_load(d, step, &d->next);
        pthread_mutex_lock(&d->mu);
        d->next_st = st;
        if (st != MT_OK) {
            snprintf(d->next_err, sizeof(d->next_err), "%s", mt_last_error_msg());
        }
        d->busy = false;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

mt_status_t mt_data_open(const mt_data_params_t *p, mt_data_t *out) {
    *out = NULL;
    if (!p || p->size != sizeof(mt_data_params_t)) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_data_open: params missing or .size not set (use MT_DATA_PARAMS_INIT)");
    }
    const char *what = p->what ? p->what : "data";
    if (p->global_batch < 1 || p->seq_len < 1 || p->vocab_size < 2) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: bad batch geometry: global_batch %lld, seq_len %lld, vocab_size %lld",
                        what, (long long)p->global_batch, (long long)p->seq_len, (long long)p->vocab_size);
    }
    if (p->dp_size < 1 || p->dp_rank < 0 || p->dp_rank >= p->dp_size || p->global_batch % p->dp_size != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s: global_batch %lld must split evenly over %d data-parallel ranks (rank %d)", what,
                        (long long)p->global_batch, p->dp_size, p->dp_rank);
    }
    struct mt_data *d = calloc(1, sizeof(*d));
    if (!d) {
        return mt_error(MT_ERR_OOM, "mt_data_open: out of memory");
    }
    d->p = *p;
    snprintf(d->what, sizeof(d->what), "%s", what);
    d->p.what = d->what;
    d->p.glob = NULL; /* not kept: the caller's string may not outlive us */
    d->next_step = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    mt_status_t st = MT_OK;
    if (p->kind == MT_DATA_SHARDS) {
        d->p.glob = p->glob;
        st = open_shards(d);
        d->p.glob = NULL;
    } else if (p->kind == MT_DATA_SYNTHETIC) {
        st = synth_init(d);
    } else {
        st = mt_error(MT_ERR_INVALID_ARG, "%s: unknown data kind %d", what, (int)p->kind);
    }
    MT_CHECK_GOTO(st, st, fail);
    MT_CHECK_GOTO(batch_alloc(d, &d->cur), st, fail);
    MT_CHECK_GOTO(batch_alloc(d, &d->next), st, fail);
    if (p->prefetch) {
        if (pthread_create(&d->thread, NULL, prefetch_main, d) != 0) {
            st = mt_error(MT_ERR_SYSTEM, "%s: cannot start the prefetch thread: %s", what, strerror(errno));
            goto fail;
        }
        d->thread_started = true;
    }
    *out = d;
    return MT_OK;
fail:
    mt_data_close(d);
    return st;
}

mt_status_t mt_data_get(mt_data_t d, int64_t step, const mt_batch_t **batch) {
    *batch = NULL;
    if (step < 0) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: negative step %lld", d->what, (long long)step);
    }
    mt_status_t st = MT_OK;
    bool have = false;
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        while (d->busy) {
            pthread_cond_wait(&d->cv, &d->mu);
        }
        if (d->next_step == step) {
            if (d->next_st != MT_OK) {
                st = mt_error(d->next_st, "%s", d->next_err);
            } else {
                batch_buf_t tmp = d->cur;
                d->cur = d->next;
                d->next = tmp;
                have = true;
            }
        }
        d->next_step = -1;
        pthread_mutex_unlock(&d->mu);
        if (st != MT_OK) {
            return st;
        }
    }
    if (have) {
        d->hits++;
    } else {
        d->misses++;
        MT_CHECK(batch_load(d, step, &d->cur));
    }
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        d->next_step = step + 1;
        d->next_st = MT_OK;
        d->busy = true;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
    *batch = &d->cur.b;
    return MT_OK;
}

int64_t mt_data_n_tokens(mt_data_t d) {
    return d->n_tokens;
}

int mt_data_n_files(mt_data_t d) {
    return d->n_shards;
}

void mt_data_prefetch_stats(mt_data_t d, int64_t *hits, int64_t *misses) {
    *hits = d->hits;
    *misses = d->misses;
}

void mt_data_close(mt_data_t d) {
    if (!d) {
        return;
    }
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        d->quit = true;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    batch_free(&d->cur);
    batch_free(&d->next);
    for (int i = 0; i < d->n_shards; i++) {
        if (d->shards[i].fd >= 0) {
            close(d->shards[i].fd);
        }
        free(d->shards[i].path);
    }
    free(d->shards);
    mt_free(d->succ);
    free(d);
}
