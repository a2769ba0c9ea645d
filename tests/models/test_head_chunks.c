/* model.head_chunks: the head's logits computed in row chunks and recomputed in backward give the whole-logits
 * run's loss and gradients (GPT-2 and the MLP, with ignored targets, more chunks than rows, every target
 * ignored, in bf16 compute), with the logits gone from the micro-batch's activations: the allocator's peak
 * equals what mt_model_act_mem plans, and is lower by what the logits took less one chunk's.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "model_testutil.h"
#include "runtime/alloc.h"
#include "runtime/tensor.h"

enum { B = 3, T = 7, N = B * T };

static mt_model_config_t cfg_of(mt_model_kind_t kind, int chunks) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = kind;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.seq_len = T;
    c.vocab_size = 37;
    c.padded_vocab = kind == MT_MODEL_GPT2 ? 40 : 0;
    c.head_chunks = chunks;
    c.seed = 9;
    return c;
}

typedef struct {
    float loss;
    float *grads;
    int64_t peak, planned; /* activation bytes: the allocator's peak over the step, mt_model_act_mem's */
} run_t;

/* One forward + backward of a fresh model on (tok, tgt), computing in dt. */
static run_t run(mt_model_kind_t kind, int chunks, int dt, const int32_t *tok, const int32_t *tgt) {
    mt_model_config_t c = cfg_of(kind, chunks);
    mt_model_t m = tm_build(&c);
    CHECK_OK(mt_model_set_compute(m, dt));
    run_t r = {0};
    mt_model_act_mem_t plan;
    CHECK_OK(mt_model_act_mem(m, 0, mt_model_n_modules(m), B, T, &plan));
    r.planned = plan.per_acts + plan.workspace;
    mt_mem_stats_t s0, s1;
    mt_mem_stats(MT_MEM_HOST, &s0);
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_acts_t a;
    CHECK_OK(mt_acts_init(m, B, T, &a));
    CHECK_OK(mt_model_step(m, a, tok, tgt, true, &r.loss));
    mt_mem_stats(MT_MEM_HOST, &s1);
    r.peak = s1.peak[MT_MEM_ACTIVATIONS] - s0.current[MT_MEM_ACTIVATIONS];
    r.grads = tm_grads_copy(m);
    mt_acts_free(a);
    mt_model_free(m);
    return r;
}

static size_t numel_of(mt_model_kind_t kind) {
    mt_model_config_t c = cfg_of(kind, 1);
    mt_model_t m = tm_build(&c);
    size_t n = mt_model_numel(m);
    mt_model_free(m);
    return n;
}

static void compare(mt_model_kind_t kind, int dt) {
    const char *name = kind == MT_MODEL_GPT2 ? "gpt2" : "mlp";
    mt_model_config_t c = cfg_of(kind, 1);
    int32_t tok[N], tgt[N];
    tm_data(tok, tgt, N, c.vocab_size, 4, 17);
    tgt[N - 1] = -1; /* the last chunk's last row ignored too */
    size_t n = numel_of(kind);
    run_t whole = run(kind, 1, dt, tok, tgt);
    CHECK(whole.peak == whole.planned, "%s: activation peak %lld = planned %lld", name, (long long)whole.peak,
          (long long)whole.planned);
    int ks[] = {2, 3, 5, N, N + 4}; /* N + 4: some chunks empty */
    for (size_t i = 0; i < MT_ARRAY_LEN(ks); i++) {
        int k = ks[i];
        run_t ch = run(kind, k, dt, tok, tgt);
        CHECK(fabsf(ch.loss - whole.loss) <= 1e-6f * fabsf(whole.loss), "%s dt %d k %d: loss %.9g vs %.9g", name, dt, k,
              ch.loss, whole.loss);
        double num = 0, den = 0;
        for (size_t e = 0; e < n; e++) {
            num = fmax(num, fabs((double)ch.grads[e] - whole.grads[e]));
            den = fmax(den, fabs((double)whole.grads[e]));
        }
        /* the same products of the same rows; OpenBLAS may block a chunk's fewer rows otherwise, and with bf16
         * compute the module's gradient is rounded once after all chunks, as the whole one is */
        CHECK(num <= 1e-5 * den, "%s dt %d k %d: gradients within 1e-5 of their largest (%.3e of %.3e)", name, dt, k,
              num, den);
        CHECK(ch.peak == ch.planned, "%s k %d: activation peak %lld = planned %lld", name, k, (long long)ch.peak,
              (long long)ch.planned);
        /* the logits (N rows) leave the micro-batch; one chunk's rows join the workspace */
        size_t Vw = kind == MT_MODEL_GPT2 ? 40 : 37, rows = mt_model_head_chunk_rows(N, k);
        int64_t saved = (int64_t)((N - rows) * Vw * sizeof(float));
        CHECK(whole.peak - ch.peak >= saved - 2 * 4096 && whole.peak - ch.peak <= saved + 2 * 4096,
              "%s k %d: the peak falls by about the logits less a chunk: %lld, expected %lld", name, k,
              (long long)(whole.peak - ch.peak), (long long)saved);
        free(ch.grads);
    }
    free(whole.grads);
}

/* Every target ignored: the loss is 0 and no gradient flows, chunked as whole. */
static void all_ignored(mt_model_kind_t kind) {
    int32_t tok[N], tgt[N];
    tm_data(tok, tgt, N, 37, -1, 3);
    for (int i = 0; i < N; i++) {
        tgt[i] = -1;
    }
    size_t n = numel_of(kind);
    run_t r = run(kind, 4, MT_F32, tok, tgt);
    int zero = 1;
    for (size_t e = 0; e < n; e++) {
        zero &= r.grads[e] == 0.0f;
    }
    CHECK(r.loss == 0.0f && zero, "every target ignored, 4 chunks: loss %g, gradients all zero %d", r.loss, zero);
    free(r.grads);
}

static void chunk_split(void) {
    size_t total = 0, j0 = 0, prev_end = 0;
    for (int j = 0; j < 4; j++) {
        size_t n = mt_model_head_chunk(10, 4, j, &j0);
        CHECK(j0 == prev_end && n <= mt_model_head_chunk_rows(10, 4), "chunk %d of 10 rows: [%zu, +%zu)", j, j0, n);
        prev_end = j0 + n;
        total += n;
    }
    CHECK(total == 10 && mt_model_head_chunk_rows(10, 4) == 3, "4 chunks cover 10 rows, 3 at most");
    mt_model_config_t c = cfg_of(MT_MODEL_GPT2, 0);
    mt_model_t m = NULL;
    CHECK(mt_model_init(&c, &m) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "model.head_chunks"),
          "head_chunks 0 is refused, naming the key: %s", mt_last_error_msg());
}

/* A pipeline stage without the head holds no chunk of the logits (and the MLP's no logits gradient): its planned
 * workspace is the same with chunks as without, the head's stage's is larger by one chunk. */
static void stage_without_head(mt_model_kind_t kind) {
    mt_model_act_mem_t mem[2][2];
    for (int c = 0; c < 2; c++) {
        mt_model_config_t cfg = cfg_of(kind, c ? 4 : 1);
        mt_model_t m = tm_build(&cfg);
        int n = mt_model_n_modules(m);
        CHECK_OK(mt_model_act_mem(m, 0, n - 1, B, T, &mem[c][0]));
        CHECK_OK(mt_model_act_mem(m, n - 1, n, B, T, &mem[c][1]));
        mt_model_free(m);
    }
    const char *name = kind == MT_MODEL_GPT2 ? "gpt2" : "mlp";
    CHECK(mem[1][0].workspace == mem[0][0].workspace && mem[1][0].per_acts == mem[0][0].per_acts,
          "%s: a stage without the head plans the same bytes with head chunks (%lld + %lld vs %lld + %lld)", name,
          (long long)mem[1][0].per_acts, (long long)mem[1][0].workspace, (long long)mem[0][0].per_acts,
          (long long)mem[0][0].workspace);
    CHECK(mem[1][1].per_acts < mem[0][1].per_acts, "%s: the head's stage keeps no logits per micro-batch", name);
    if (kind == MT_MODEL_GPT2) {
        CHECK(mem[1][1].workspace > mem[0][1].workspace, "gpt2: the head's stage holds one chunk in its workspace");
    }
}

int main(void) {
    chunk_split();
    compare(MT_MODEL_GPT2, MT_F32);
    compare(MT_MODEL_GPT2, MT_BF16);
    compare(MT_MODEL_MLP, MT_F32);
    all_ignored(MT_MODEL_GPT2);
    all_ignored(MT_MODEL_MLP);
    stage_without_head(MT_MODEL_GPT2);
    stage_without_head(MT_MODEL_MLP);
    return mt_test_finish("test_head_chunks");
}
