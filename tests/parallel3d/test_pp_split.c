/* Pipeline stage splits: balanced by compute for GPT-2 (blocks equal, head charged for the tied
 * matrix, embedding nearly free), by hand from parallel.stage_layers, and every malformed
 * stage_layers refused with a message naming the key and the fix. One process, no communication.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "eqref.h"
#include "parallel/pipeline.h"
#include "testutil.h"

static void expect_bounds(mt_model_t m, int pp, const char *spec, const int *want) {
    int b[16];
    mt_status_t st = mt_pipeline_split(m, pp, spec, b);
    CHECK(st == MT_OK, "split pp=%d \"%s\": %s", pp, spec ? spec : "", mt_last_error_msg());
    if (st != MT_OK) {
        return;
    }
    for (int i = 0; i <= pp; i++) {
        CHECK(b[i] == want[i], "split pp=%d \"%s\": bound %d is %d, expected %d", pp, spec ? spec : "", i, b[i],
              want[i]);
    }
}

static void expect_error(mt_model_t m, int pp, const char *spec, const char *needle) {
    int b[16];
    mt_status_t st = mt_pipeline_split(m, pp, spec, b);
    CHECK(st == MT_ERR_INVALID_ARG, "split pp=%d \"%s\" returned %s", pp, spec, mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "message \"%s\" lacks \"%s\"", mt_last_error_msg(), needle);
}

int main(void) {
    mt_model_config_t mc = eq_tiny_gpt2();
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&mc, &m));
    CHECK(mt_model_n_modules(m) == 6, "tiny GPT-2 has %d modules", mt_model_n_modules(m));

    /* Costs: embedding 16*32 (wpe), each block 12*32^2 = 12288, head 128*32 = 4096 (tied wte). */
    expect_bounds(m, 1, NULL, (int[]){0, 6});
    expect_bounds(m, 2, NULL, (int[]){0, 3, 6});
    expect_bounds(m, 4, "", (int[]){0, 2, 3, 4, 6});
    expect_bounds(m, 6, NULL, (int[]){0, 1, 2, 3, 4, 5, 6});
    /* By hand: blocks per stage; the embedding joins the first stage, the head the last. */
    expect_bounds(m, 2, "1,3", (int[]){0, 2, 6});
    expect_bounds(m, 2, "0,4", (int[]){0, 1, 6});
    expect_bounds(m, 2, "4,0", (int[]){0, 5, 6});
    expect_bounds(m, 4, "1,1,1,1", (int[]){0, 2, 3, 4, 6});

    expect_error(m, 2, "3,3", "sums to 6 blocks but the model has 4");
    expect_error(m, 3, "2,2", "has 2 entries but parallel.pp = 3");
    expect_error(m, 2, "2,1,1", "more than parallel.pp = 2");
    expect_error(m, 2, "2,x", "entry 2 is not a non-negative integer");
    expect_error(m, 2, "-1,5", "entry 1 is not a non-negative integer");
    expect_error(m, 2, "2,2,", "ends with a comma");
    expect_error(m, 3, "2,0,2", "stage 1 would have no module");
    expect_error(m, 7, NULL, "at most 6 pipeline stages");
    mt_model_free(m);

    /* A big vocabulary makes the head the most expensive module: balancing gives it a stage of its own. */
    mc.vocab_size = 4096;
    mc.padded_vocab = 0; /* derived again for the new vocabulary */
    mc.n_layer = 6;
    CHECK_OK(mt_model_init(&mc, &m));
    expect_bounds(m, 2, NULL, (int[]){0, 7, 8});
    mt_model_free(m);

    /* model.head_chunks recomputes the head's product in backward: it costs 4/3. 4 blocks of 12288, head
     * 384*32 = 12288: unchunked [emb b0 b1 | b2 b3 head] (max 36864) beats [emb b0 b1 b2 | b3 head] (37376);
     * chunked the head costs 16384 and the second wins (37376 against 40960). */
    mc.vocab_size = 384;
    mc.padded_vocab = 384;
    mc.n_layer = 4;
    CHECK_OK(mt_model_init(&mc, &m));
    expect_bounds(m, 2, NULL, (int[]){0, 3, 6});
    mt_model_free(m);
    mc.head_chunks = 2;
    CHECK_OK(mt_model_init(&mc, &m));
    expect_bounds(m, 2, NULL, (int[]){0, 4, 6});
    mt_model_free(m);

    mt_pp_schedule_t s;
    CHECK(mt_pp_schedule_parse("gpipe", &s) && s == MT_PP_GPIPE, "gpipe");
    CHECK(mt_pp_schedule_parse("1f1b", &s) && s == MT_PP_1F1B, "1f1b");
    CHECK(!mt_pp_schedule_parse("zb", &s), "unknown schedule accepted");
    CHECK(mt_pipeline_max_in_flight(MT_PP_1F1B, 4, 0, 8) == 4, "1f1b stage 0 of 4");
    CHECK(mt_pipeline_max_in_flight(MT_PP_1F1B, 4, 3, 8) == 1, "1f1b last stage");
    CHECK(mt_pipeline_max_in_flight(MT_PP_1F1B, 4, 0, 2) == 2, "1f1b m < p");
    CHECK(mt_pipeline_max_in_flight(MT_PP_GPIPE, 4, 0, 8) == 8, "gpipe");
    return mt_test_finish("test_pp_split");
}
