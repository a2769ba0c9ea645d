/* Device-mesh layout: Megatron-LM's documented 16-GPU example (tp=2, pp=4) reproduced group by group,
 * hand-checked layouts of other orders, exhaustive properties over many meshes and all 6 orders
 * (groups partition the world for every axis combination, coordinates round-trip), and bad input.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "runtime/mesh.h"
#include "testutil.h"

static const char *const orders[6] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

/* Checks that the group of rank `of` along mask is exactly want[0..n). */
static void check_group(const mt_mesh_t *m, int of, unsigned mask, const int *want, int n, const char *what) {
    int got[64], idx = -1;
    int k = mt_mesh_group(m, of, mask, got, &idx);
    CHECK(k == n, "%s of rank %d: %d members, want %d", what, of, k, n);
    for (int i = 0; i < n && i < k; i++) {
        CHECK(got[i] == want[i], "%s of rank %d: member %d is %d, want %d", what, of, i, got[i], want[i]);
        if (want[i] == of) {
            CHECK(idx == i, "%s of rank %d: index %d, want %d", what, of, idx, i);
        }
    }
}

/* Megatron-LM, megatron/core/parallel_state.py, initialize_model_parallel docstring: "we have a total
 * of 16 GPUs denoted by g0 ... g15 and we use 2 GPUs to parallelize the model tensor, and 4 GPUs to
 * parallelize the model pipeline ... 8 data_parallel groups: [g0, g2], [g1, g3], [g4, g6], [g5, g7],
 * [g8, g10], [g9, g11], [g12, g14], [g13, g15]; 8 tensor model-parallel groups: [g0, g1], [g2, g3],
 * [g4, g5], [g6, g7], [g8, g9], [g10, g11], [g12, g13], [g14, g15]; 4 pipeline model-parallel groups:
 * [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, g6, g10, g14], [g3, g7, g11, g15]". The same function
 * builds model-parallel groups (tp x pp: [0,1,4,5,8,9,12,13], [2,3,6,7,10,11,14,15]) and embedding
 * groups (first and last rank of each pipeline group). */
static void test_megatron(void) {
    mt_mesh_t *m = NULL;
    CHECK_OK(mt_mesh_create(16, 2, 4, 0, "tp-dp-pp", &m));
    if (!m) {
        return;
    }
    CHECK(mt_mesh_axis_size(m, MT_AXIS_DP) == 2, "dp derived as %d", mt_mesh_axis_size(m, MT_AXIS_DP));
    static const int dp_groups[8][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}};
    static const int tp_groups[8][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
    static const int pp_groups[4][4] = {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
    static const int mp_groups[2][8] = {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}};
    for (int g = 0; g < 8; g++) {
        for (int j = 0; j < 2; j++) {
            check_group(m, dp_groups[g][j], MT_AXIS_BIT(MT_AXIS_DP), dp_groups[g], 2, "dp group");
            check_group(m, tp_groups[g][j], MT_AXIS_BIT(MT_AXIS_TP), tp_groups[g], 2, "tp group");
        }
    }
    for (int g = 0; g < 4; g++) {
        for (int j = 0; j < 4; j++) {
            int r = pp_groups[g][j];
            check_group(m, r, MT_AXIS_BIT(MT_AXIS_PP), pp_groups[g], 4, "pp group");
            CHECK(mt_mesh_pp_prev(m, r) == (j > 0 ? pp_groups[g][j - 1] : -1), "pp prev of %d", r);
            CHECK(mt_mesh_pp_next(m, r) == (j < 3 ? pp_groups[g][j + 1] : -1), "pp next of %d", r);
            int emb[2] = {-1, -1};
            CHECK(mt_mesh_embedding_group(m, r, emb) == 2, "embedding group of %d has 2 ranks", r);
            CHECK(emb[0] == pp_groups[g][0] && emb[1] == pp_groups[g][3], "embedding group of %d is [%d,%d]", r, emb[0],
                  emb[1]);
        }
    }
    for (int g = 0; g < 2; g++) {
        for (int j = 0; j < 8; j++) {
            check_group(m, mp_groups[g][j], MT_AXIS_BIT(MT_AXIS_TP) | MT_AXIS_BIT(MT_AXIS_PP), mp_groups[g], 8,
                        "model-parallel (tp-pp) group");
        }
    }
    /* The documented formula: rank = tp_rank + tp * (dp_rank + dp * pp_rank). */
    for (int r = 0; r < 16; r++) {
        int c[MT_AXIS_N];
        mt_mesh_coords(m, r, c);
        CHECK(r == c[MT_AXIS_TP] + 2 * (c[MT_AXIS_DP] + 2 * c[MT_AXIS_PP]), "rank %d coords %d,%d,%d", r, c[0], c[1],
              c[2]);
    }
    CHECK(!strcmp(mt_mesh_order(m), "tp-dp-pp"), "order %s", mt_mesh_order(m));
    mt_mesh_free(m);
}

/* Hand-derived: 8 ranks, tp=2, dp=2, pp=2 in order "pp-dp-tp": rank = pp + 2 * (dp + 2 * tp), so tp
 * groups are {r, r+4}, dp groups {r, r+2}, pp groups {r, r+1}. And pp = 1: the embedding group is one rank. */
static void test_other_orders(void) {
    mt_mesh_t *m = NULL;
    CHECK_OK(mt_mesh_create(8, 2, 2, 2, "pp-dp-tp", &m));
    if (m) {
        check_group(m, 1, MT_AXIS_BIT(MT_AXIS_TP), (const int[]){1, 5}, 2, "tp group");
        check_group(m, 5, MT_AXIS_BIT(MT_AXIS_DP), (const int[]){5, 7}, 2, "dp group");
        check_group(m, 6, MT_AXIS_BIT(MT_AXIS_PP), (const int[]){6, 7}, 2, "pp group");
        check_group(m, 3, MT_AXIS_BIT(MT_AXIS_TP) | MT_AXIS_BIT(MT_AXIS_DP), (const int[]){1, 3, 5, 7}, 4, "tp-dp");
        check_group(m, 3, 0, (const int[]){3}, 1, "empty mask");
        check_group(m, 3, 7, (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, "all axes");
        CHECK(mt_mesh_pp_next(m, 6) == 7 && mt_mesh_pp_prev(m, 7) == 6 && mt_mesh_pp_prev(m, 6) == -1, "pp links");
        mt_mesh_free(m);
    }
    CHECK_OK(mt_mesh_create(6, 3, 1, 2, "dp-tp-pp", &m));
    if (m) {
        check_group(m, 4, MT_AXIS_BIT(MT_AXIS_TP), (const int[]){0, 2, 4}, 3, "tp group (dp fastest)");
        int emb[2] = {-1, -1};
        CHECK(mt_mesh_embedding_group(m, 4, emb) == 1 && emb[0] == 4, "pp=1 embedding group is the rank itself");
        CHECK(mt_mesh_pp_next(m, 4) == -1 && mt_mesh_pp_prev(m, 4) == -1, "pp=1 has no neighbours");
        mt_mesh_free(m);
    }
}

/* Every property, for one mesh. */
static void check_properties(int world, int tp, int pp, const char *order) {
    mt_mesh_t *m = NULL;
    mt_status_t st = mt_mesh_create(world, tp, pp, 0, order, &m);
    CHECK(st == MT_OK, "create world %d tp %d pp %d %s: %s", world, tp, pp, order, mt_last_error_msg());
    if (!m) {
        return;
    }
    int dp = world / (tp * pp);
    int *ranks = malloc(sizeof(int) * (size_t)world);
    int *seen = malloc(sizeof(int) * (size_t)world);
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int c[MT_AXIS_N];
        mt_mesh_coords(m, r, c);
        if (mt_mesh_rank_of(m, c) != r || c[MT_AXIS_TP] >= tp || c[MT_AXIS_DP] >= dp || c[MT_AXIS_PP] >= pp) {
            bad++;
        }
    }
    CHECK(bad == 0, "%d coordinate round trips failed (world %d tp %d pp %d %s)", bad, world, tp, pp, order);
    for (unsigned mask = 0; mask < 8; mask++) {
        memset(seen, 0, sizeof(int) * (size_t)world);
        int want = mt_mesh_group_size(m, mask), n_groups = 0;
        bad = 0;
        for (int r = 0; r < world; r++) {
            int idx = -1, k = mt_mesh_group(m, r, mask, ranks, &idx);
            if (k != want || idx < 0 || ranks[idx] != r) {
                bad++;
                continue;
            }
            int c0[MT_AXIS_N];
            mt_mesh_coords(m, r, c0);
            for (int i = 0; i < k; i++) {
                int c[MT_AXIS_N];
                mt_mesh_coords(m, ranks[i], c);
                for (int a = 0; a < MT_AXIS_N; a++) {
                    if (!(mask & MT_AXIS_BIT(a)) && c[a] != c0[a]) {
                        bad++; /* a member differs outside the group's axes */
                    }
                }
                if (i > 0 && ranks[i] <= ranks[i - 1]) {
                    bad++; /* not in increasing rank order */
                }
            }
            if (idx == 0) { /* count each group once, at its first member */
                n_groups++;
                for (int i = 0; i < k; i++) {
                    seen[ranks[i]]++;
                }
            }
        }
        for (int r = 0; r < world; r++) {
            bad += seen[r] != 1;
        }
        CHECK(bad == 0 && n_groups * want == world, "mask %u: %d violations, %d groups of %d (world %d tp %d pp %d %s)",
              mask, bad, n_groups, want, world, tp, pp, order);
    }
    bad = 0;
    for (int r = 0; r < world; r++) {
        int c[MT_AXIS_N], emb[2];
        mt_mesh_coords(m, r, c);
        int nx = mt_mesh_pp_next(m, r), pv = mt_mesh_pp_prev(m, r);
        bad += (c[MT_AXIS_PP] == pp - 1) != (nx < 0);
        bad += (c[MT_AXIS_PP] == 0) != (pv < 0);
        bad += nx >= 0 && mt_mesh_pp_prev(m, nx) != r;
        int ne = mt_mesh_embedding_group(m, r, emb);
        bad += ne != (pp == 1 ? 1 : 2);
        int ce[MT_AXIS_N];
        mt_mesh_coords(m, emb[0], ce);
        bad += ce[MT_AXIS_PP] != 0 || ce[MT_AXIS_TP] != c[MT_AXIS_TP] || ce[MT_AXIS_DP] != c[MT_AXIS_DP];
        if (ne == 2) {
            mt_mesh_coords(m, emb[1], ce);
            bad += ce[MT_AXIS_PP] != pp - 1 || ce[MT_AXIS_TP] != c[MT_AXIS_TP] || ce[MT_AXIS_DP] != c[MT_AXIS_DP];
        }
    }
    CHECK(bad == 0, "%d pipeline/embedding violations (world %d tp %d pp %d %s)", bad, world, tp, pp, order);
    free(ranks);
    free(seen);
    mt_mesh_free(m);
}

static void test_properties(void) {
    static const int worlds[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 30, 64, 96};
    int meshes = 0;
    for (size_t w = 0; w < MT_ARRAY_LEN(worlds); w++) {
        int world = worlds[w];
        for (int tp = 1; tp <= world; tp++) {
            for (int pp = 1; tp * pp <= world; pp++) {
                if (world % (tp * pp)) {
                    continue;
                }
                for (int o = 0; o < 6; o++) {
                    check_properties(world, tp, pp, orders[o]);
                    meshes++;
                }
            }
        }
    }
    CHECK(meshes > 500, "only %d meshes checked", meshes);
}

static void test_bad_input(void) {
    mt_mesh_t *m = (mt_mesh_t *)1;
    CHECK(mt_mesh_create(10, 4, 1, 0, "tp-dp-pp", &m) == MT_ERR_INVALID_ARG && !m, "10 ranks, tp 4");
    CHECK(strstr(mt_last_error_msg(), "not divisible"), "message: %s", mt_last_error_msg());
    CHECK(mt_mesh_create(8, 2, 2, 3, "tp-dp-pp", &m) == MT_ERR_INVALID_ARG, "2x3x2 != 8");
    CHECK(mt_mesh_create(0, 1, 1, 0, "tp-dp-pp", &m) == MT_ERR_INVALID_ARG, "world 0");
    CHECK(mt_mesh_create(4, 0, 1, 0, "tp-dp-pp", &m) == MT_ERR_INVALID_ARG, "tp 0");
    static const char *const bad_orders[] = {"tp-dp", "tp-tp-pp",  "xx-dp-pp",    "auto",    "tp-dp-pp-",
                                             "",      "tp--dp-pp", "tp-dp-pp-tp", "TP-DP-PP"};
    for (size_t i = 0; i < MT_ARRAY_LEN(bad_orders); i++) {
        m = (mt_mesh_t *)1;
        CHECK(mt_mesh_create(4, 2, 1, 0, bad_orders[i], &m) == MT_ERR_INVALID_ARG && !m, "order \"%s\" accepted",
              bad_orders[i]);
        CHECK(strstr(mt_last_error_msg(), "order") || strstr(mt_last_error_msg(), "axis"), "message for \"%s\": %s",
              bad_orders[i], mt_last_error_msg());
    }
    unsigned mask = 0;
    int n = 0;
    CHECK_OK(mt_mesh_parse_axes("dp-tp", &mask, NULL, &n));
    CHECK(mask == (MT_AXIS_BIT(MT_AXIS_DP) | MT_AXIS_BIT(MT_AXIS_TP)) && n == 2, "dp-tp mask %u n %d", mask, n);
    CHECK(mt_mesh_parse_axes("tp-ep", &mask, NULL, &n) == MT_ERR_INVALID_ARG, "unknown axis ep");
    CHECK(strstr(mt_last_error_msg(), "'ep'"), "message names the axis: %s", mt_last_error_msg());
}

int main(void) {
    test_megatron();
    test_other_orders();
    test_properties();
    test_bad_input();
    return mt_test_finish("test_mesh");
}
