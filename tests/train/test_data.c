/* The data loader: every malformed-shard class is refused with a message naming it; random order is
 * deterministic in (seed, step) and independent of the dp layout; sequential order matches an llm.c-style
 * simulation window for window; synthetic rows follow the stated Markov chain; prefetching serves the
 * next step from the background thread without changing any batch.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/data/data.h"
#include "runtime/alloc.h"
#include "testutil.h"

static char dir[64];

static void path_of(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

/* A shard whose token i is (base + i) % mod: every token tells where it came from. */
static void write_positional(const char *name, int64_t n, int base, int mod) {
    char p[128];
    path_of(p, sizeof(p), name);
    uint16_t *t = malloc((size_t)n * 2 + 2);
    for (int64_t i = 0; i < n; i++) {
        t[i] = (uint16_t)((base + i) % mod);
    }
    CHECK_OK(mt_shard_write(p, t, (size_t)n));
    free(t);
}

/* Writes raw bytes: header fields and a token payload of `payload` tokens (all 1). */
static void write_raw(const char *name, int32_t magic, int32_t version, int32_t count, int64_t payload,
                      int bad_token_at) {
    char p[128];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "wb");
    int32_t h[256] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = count;
    fwrite(h, 4, 256, f);
    for (int64_t i = 0; i < payload; i++) {
        uint16_t t = (i == bad_token_at) ? 300 : 1;
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

static mt_status_t open_glob(const char *pattern, mt_data_order_t order, mt_data_t *d) {
    char p[128];
    path_of(p, sizeof(p), pattern);
    mt_data_params_t prm = MT_DATA_PARAMS_INIT;
    prm.kind = MT_DATA_SHARDS;
    prm.glob = p;
    prm.what = "data.train";
    prm.order = order;
    prm.global_batch = 2;
    prm.seq_len = 4;
    prm.vocab_size = 256;
    return mt_data_open(&prm, d);
}

static void expect_error(const char *pattern, const char *needle) {
    mt_data_t d = NULL;
    mt_status_t st = open_glob(pattern, MT_DATA_RANDOM, &d);
    CHECK(st == MT_ERR_INVALID_ARG && d == NULL, "%s: expected MT_ERR_INVALID_ARG, got %s", pattern,
          mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "%s: message lacks \"%s\": %s", pattern, needle,
          mt_last_error_msg());
    CHECK(strstr(mt_last_error_msg(), "data.train") != NULL, "message names the key: %s", mt_last_error_msg());
}

static void test_malformed(void) {
    write_raw("magic.bin", 20240521, 1, 10, 10, -1);
    expect_error("magic.bin", "bad magic 20240521");
    write_raw("version.bin", 20240520, 2, 10, 10, -1);
    expect_error("version.bin", "version 2");
    write_raw("trunc.bin", 20240520, 1, 100, 50, -1);
    expect_error("trunc.bin", "truncated: header says 100 tokens = 1224 bytes, file has 1124");
    char p[128];
    path_of(p, sizeof(p), "short.bin");
    FILE *f = fopen(p, "wb");
    fwrite("xx", 1, 2, f);
    fclose(f);
    expect_error("short.bin", "truncated");
    write_raw("trailing.bin", 20240520, 1, 10, 12, -1);
    expect_error("trailing.bin", "trailing data");
    write_raw("token.bin", 20240520, 1, 40, 40, 17);
    expect_error("token.bin", "token 300 at index 17 is >= vocab_size 256");
    write_raw("negative.bin", 20240520, 1, -5, 0, -1);
    expect_error("negative.bin", "negative token count");
    expect_error("nothing_*.bin", "no file matches");
    /* a good shard next to a bad one: the bad one is still found */
    write_positional("mix_a.bin", 100, 0, 256);
    write_raw("mix_b.bin", 1, 1, 10, 10, -1);
    expect_error("mix_*.bin", "mix_b.bin: bad magic");
    /* too little data for one sequence */
    write_positional("tiny.bin", 4, 0, 256);
    expect_error("tiny.bin", "no shard holds a sequence of seq_len + 1 = 5 tokens");

    mt_data_params_t prm = MT_DATA_PARAMS_INIT;
    prm.kind = MT_DATA_SHARDS;
    prm.glob = "";
    prm.what = "data.val";
    mt_data_t d = NULL;
    CHECK(mt_data_open(&prm, &d) == MT_ERR_INVALID_ARG, "empty glob rejected");
    CHECK(strstr(mt_last_error_msg(), "data.val is empty") != NULL, "%s", mt_last_error_msg());
    prm = (mt_data_params_t)MT_DATA_PARAMS_INIT;
    prm.global_batch = 3;
    prm.dp_size = 2;
    CHECK(mt_data_open(&prm, &d) == MT_ERR_INVALID_ARG, "batch 3 over 2 ranks rejected");
    CHECK(strstr(mt_last_error_msg(), "split evenly") != NULL, "%s", mt_last_error_msg());

    int64_t n = 0;
    path_of(p, sizeof(p), "mix_a.bin");
    CHECK_OK(mt_shard_check(p, 256, &n));
    CHECK(n == 100, "round trip of the writer: %lld tokens", (long long)n);
}

static mt_data_t open_layout(mt_data_kind_t kind, mt_data_order_t order, uint64_t seed, int64_t B, int64_t T,
                             int rank, int size, bool prefetch, int split) {
    char p[128];
    path_of(p, sizeof(p), "pos_*.bin");
    mt_data_params_t prm = MT_DATA_PARAMS_INIT;
    prm.kind = kind;
    prm.glob = p;
    prm.order = order;
    prm.seed = seed;
    prm.global_batch = B;
    prm.seq_len = T;
    prm.vocab_size = kind == MT_DATA_SHARDS ? 65536 : 97;
    prm.dp_rank = rank;
    prm.dp_size = size;
    prm.prefetch = prefetch;
    prm.split = split;
    mt_data_t d = NULL;
    CHECK_OK(mt_data_open(&prm, &d));
    return d;
}

/* dp = 1 batch == concatenation of the dp = 2 and dp = 4 slices, for every step and both orders. */
static void test_layout_independence(mt_data_kind_t kind, mt_data_order_t order) {
    enum { B = 8, T = 6 };
    mt_data_t one = open_layout(kind, order, 42, B, T, 0, 1, true, 0);
    mt_data_t two[2], four[4];
    for (int r = 0; r < 2; r++) {
        two[r] = open_layout(kind, order, 42, B, T, r, 2, true, 0);
    }
    for (int r = 0; r < 4; r++) {
        four[r] = open_layout(kind, order, 42, B, T, r, 4, false, 0);
    }
    int bad = 0;
    for (int64_t s = 0; s < 12; s++) {
        const mt_batch_t *b1 = NULL, *b;
        CHECK_OK(mt_data_get(one, s, &b1));
        if (!b1) {
            return;
        }
        CHECK(b1->rows == B && b1->step == s, "full batch");
        for (int r = 0; r < 2; r++) {
            CHECK_OK(mt_data_get(two[r], s, &b));
            bad += b->rows != B / 2 || memcmp(b->inputs, b1->inputs + r * (B / 2) * T, sizeof(int32_t) * B / 2 * T) ||
                   memcmp(b->targets, b1->targets + r * (B / 2) * T, sizeof(int32_t) * B / 2 * T);
        }
        for (int r = 0; r < 4; r++) {
            CHECK_OK(mt_data_get(four[r], s, &b));
            bad += memcmp(b->inputs, b1->inputs + r * (B / 4) * T, sizeof(int32_t) * B / 4 * T) ||
                   memcmp(b->targets, b1->targets + r * (B / 4) * T, sizeof(int32_t) * B / 4 * T);
        }
        for (int64_t i = 0; i < B; i++) { /* targets are inputs shifted by one */
            bad += memcmp(b1->targets + i * T, b1->inputs + i * T + 1, sizeof(int32_t) * (T - 1)) != 0;
        }
    }
    CHECK(bad == 0, "kind %d order %d: %d slices differ from the dp = 1 batch", kind, order, bad);
    mt_data_close(one);
    for (int r = 0; r < 2; r++) {
        mt_data_close(two[r]);
    }
    for (int r = 0; r < 4; r++) {
        mt_data_close(four[r]);
    }
}

/* Random order: same (seed, step) -> same batch, different seed or step -> different, every row a
 * contiguous window of one shard (positional tokens make that checkable). */
static void test_random(void) {
    enum { B = 4, T = 8 };
    mt_data_t a = open_layout(MT_DATA_SHARDS, MT_DATA_RANDOM, 7, B, T, 0, 1, true, 0);
    mt_data_t b = open_layout(MT_DATA_SHARDS, MT_DATA_RANDOM, 7, B, T, 0, 1, false, 0);
    mt_data_t c = open_layout(MT_DATA_SHARDS, MT_DATA_RANDOM, 8, B, T, 0, 1, false, 0);
    static int32_t first[B * T];
    int same_seed_diff = 0, other_seed_same = 0, steps_same = 0, noncontig = 0;
    int64_t seen_shard[3] = {0, 0, 0};
    for (int64_t s = 0; s < 50; s++) {
        const mt_batch_t *ba, *bb, *bc;
        CHECK_OK(mt_data_get(a, s, &ba));
        CHECK_OK(mt_data_get(b, s, &bb));
        CHECK_OK(mt_data_get(c, s, &bc));
        same_seed_diff += memcmp(ba->inputs, bb->inputs, sizeof(int32_t) * B * T) != 0;
        other_seed_same += memcmp(ba->inputs, bc->inputs, sizeof(int32_t) * B * T) == 0;
        if (s == 0) {
            memcpy(first, ba->inputs, sizeof(first));
        } else {
            steps_same += memcmp(first, ba->inputs, sizeof(first)) == 0;
        }
        for (int r = 0; r < B; r++) {
            const int32_t *in = ba->inputs + r * T, *tg = ba->targets + r * T;
            for (int t = 1; t < T; t++) {
                noncontig += in[t] != in[t - 1] + 1;
            }
            noncontig += tg[T - 1] != in[T - 1] + 1;
            seen_shard[in[0] / 10000]++;
        }
    }
    CHECK(same_seed_diff == 0, "same seed, same batches (with and without prefetch)");
    CHECK(other_seed_same == 0, "another seed gives other batches");
    CHECK(steps_same == 0, "steps differ");
    CHECK(noncontig == 0, "%d rows are not contiguous windows of one shard", noncontig);
    CHECK(seen_shard[0] > 0 && seen_shard[1] == 0 && seen_shard[2] > 0,
          "both long shards drawn, the 5-token one (no window of T + 1 = 9) never: %lld %lld %lld",
          (long long)seen_shard[0], (long long)seen_shard[1], (long long)seen_shard[2]);
    /* windows are weighted by size: shard 0 (300 tokens) gets more than shard 2 (60) */
    CHECK(seen_shard[0] > seen_shard[2], "draws follow window counts");
    mt_data_close(a);
    mt_data_close(b);
    mt_data_close(c);
}

/* Sequential order against an independent simulation of llm.c's loader (no shuffling): check before
 * each read that the window B*T + 1 fits the shard, else move to the next shard (wrapping). */
static void test_sequential(void) {
    enum { B = 2, T = 4 };
    int64_t sizes[3] = {300, 5, 60}; /* pos_b (5 tokens) holds no window of 9 and is skipped */
    int base[3] = {0, 10000, 20000};
    mt_data_t d = open_layout(MT_DATA_SHARDS, MT_DATA_SEQUENTIAL, 1, B, T, 0, 1, true, 0);
    int shard = 0;
    int64_t pos = 0;
    int bad = 0;
    int64_t steps = 2 * (299 / 8 + 59 / 8) + 3; /* twice round the cycle and then some */
    for (int64_t s = 0; s < steps; s++) {
        while (pos + B * T + 1 > sizes[shard]) {
            shard = (shard + 1) % 3;
            pos = 0;
        }
        const mt_batch_t *b;
        CHECK_OK(mt_data_get(d, s, &b));
        for (int r = 0; r < B; r++) {
            for (int t = 0; t < T; t++) {
                bad += b->inputs[r * T + t] != base[shard] + pos + r * T + t;
                bad += b->targets[r * T + t] != base[shard] + pos + r * T + t + 1;
            }
        }
        pos += B * T;
    }
    CHECK(bad == 0, "%d tokens differ from the llm.c-style sequence", bad);
    /* any step can be asked for directly (resume): step 40 equals what the walk gives */
    const mt_batch_t *b;
    CHECK_OK(mt_data_get(d, 3, &b));
    CHECK(b->inputs[0] == 24, "step 3 starts at token 24 of the first shard: %d", b->inputs[0]);
    CHECK_OK(mt_data_get(d, 37, &b));
    CHECK(b->inputs[0] == 20000, "step 37 = first window of the third shard: %d", b->inputs[0]);
    CHECK_OK(mt_data_get(d, 44, &b));
    CHECK(b->inputs[0] == 0, "step 44 wraps to the first shard: %d", b->inputs[0]);
    mt_data_close(d);
}

static void test_synthetic(void) {
    enum { B = 16, T = 64, V = 97 };
    mt_data_t d = open_layout(MT_DATA_SYNTHETIC, MT_DATA_RANDOM, 5, B, T, 0, 1, true, 0);
    mt_data_t v = open_layout(MT_DATA_SYNTHETIC, MT_DATA_RANDOM, 5, B, T, 0, 1, true, 1);
    CHECK_CLOSE(mt_synth_entropy(V), log(4.0), 1e-15, 0);
    CHECK_CLOSE(mt_synth_entropy(3), log(3.0), 1e-15, 0);
    static int32_t succ[V][4];
    static int64_t count[V][4];
    for (int s = 0; s < V; s++) {
        CHECK(mt_synth_successors(d, s, succ[s]) == 4, "K = 4");
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < i; j++) {
                CHECK(succ[s][i] != succ[s][j], "successors distinct");
            }
        }
    }
    int off_chain = 0, starts_seen = 0, same_as_val = 0;
    static int start_hist[V];
    int64_t total = 0;
    for (int64_t s = 0; s < 40; s++) {
        const mt_batch_t *b, *bv;
        CHECK_OK(mt_data_get(d, s, &b));
        CHECK_OK(mt_data_get(v, s, &bv));
        same_as_val += memcmp(b->inputs, bv->inputs, sizeof(int32_t) * B * T) == 0;
        for (int r = 0; r < B; r++) {
            const int32_t *in = b->inputs + r * T, *tg = b->targets + r * T;
            start_hist[in[0]]++;
            for (int t = 0; t < T; t++) {
                int k = -1;
                for (int j = 0; j < 4; j++) {
                    k = succ[in[t]][j] == tg[t] ? j : k;
                }
                off_chain += k < 0;
                if (k >= 0) {
                    count[in[t]][k]++;
                    total++;
                }
            }
        }
    }
    for (int s = 0; s < V; s++) {
        starts_seen += start_hist[s] > 0;
    }
    CHECK(off_chain == 0, "%d transitions outside the chain", off_chain);
    CHECK(same_as_val == 0, "validation rows differ from training rows");
    CHECK(starts_seen > V * 9 / 10, "starts cover the vocabulary: %d of %d", starts_seen, V);
    /* the empirical conditional entropy of next given previous approaches ln 4 (40960 transitions) */
    double h = 0;
    for (int s = 0; s < V; s++) {
        int64_t n = 0;
        for (int j = 0; j < 4; j++) {
            n += count[s][j];
        }
        for (int j = 0; j < 4; j++) {
            if (count[s][j] > 0) {
                double p = (double)count[s][j] / (double)n;
                h -= (double)n / (double)total * p * log(p);
            }
        }
    }
    CHECK(fabs(h - log(4.0)) < 0.01, "empirical conditional entropy %.4f vs ln 4 = %.4f", h, log(4.0));
    mt_data_close(d);
    mt_data_close(v);
}

static void test_prefetch(void) {
    enum { B = 4, T = 16 };
    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    mt_data_t pf = open_layout(MT_DATA_SHARDS, MT_DATA_RANDOM, 3, B, T, 0, 1, true, 0);
    mt_data_t sync = open_layout(MT_DATA_SHARDS, MT_DATA_RANDOM, 3, B, T, 0, 1, false, 0);
    int differ = 0;
    int64_t order[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 4, 5, 20, 21};
    for (size_t i = 0; i < MT_ARRAY_LEN(order); i++) {
        const mt_batch_t *a, *b;
        CHECK_OK(mt_data_get(pf, order[i], &a));
        usleep(2000); /* "compute": the worker loads the next step meanwhile */
        CHECK_OK(mt_data_get(sync, order[i], &b));
        differ += a->step != order[i] || memcmp(a->inputs, b->inputs, sizeof(int32_t) * B * T) != 0 ||
                  memcmp(a->targets, b->targets, sizeof(int32_t) * B * T) != 0;
    }
    int64_t hits, misses;
    mt_data_prefetch_stats(pf, &hits, &misses);
    CHECK(differ == 0, "prefetched batches equal synchronous ones");
    CHECK(hits == 11 && misses == 3, "served ahead: %lld hits, %lld misses (expected 11, 3)", (long long)hits,
          (long long)misses);
    mt_data_prefetch_stats(sync, &hits, &misses);
    CHECK(hits == 0 && misses == 14, "no thread, no hits");
    mt_data_close(pf);
    mt_data_close(sync);
    mt_mem_stats(MT_MEM_HOST, &after);
    CHECK(after.current[MT_MEM_OTHER] == before.current[MT_MEM_OTHER], "loader frees its buffers");
}

int main(void) {
    snprintf(dir, sizeof(dir), "/tmp/mt_test_data_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_malformed();
    write_positional("pos_a.bin", 300, 0, 65536);
    write_positional("pos_b.bin", 5, 10000, 65536);
    write_positional("pos_c.bin", 60, 20000, 65536);
    test_layout_independence(MT_DATA_SHARDS, MT_DATA_RANDOM);
    test_layout_independence(MT_DATA_SHARDS, MT_DATA_SEQUENTIAL);
    test_layout_independence(MT_DATA_SYNTHETIC, MT_DATA_RANDOM);
    test_random();
    test_sequential();
    test_synthetic();
    test_prefetch();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    return mt_test_finish("test_data");
}
