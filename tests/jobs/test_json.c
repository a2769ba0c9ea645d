/* The manifest reader: values of every kind, escapes (\u to UTF-8), lookups, integers checked, and every
 * malformed input refused with its byte offset (truncation at every length of a valid document, nesting
 * beyond 64, trailing garbage, bad escapes and numbers).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "train/job_json.h"
#include "testutil.h"

static const char *doc = "{\"a\": [1, 2.5, -3e2, true, false, null], \"s\": \"x\\\"y\\\\z\\n\\u00e9\\u20ac\", "
                         "\"o\": {\"k\": 9007199254740992, \"f\": 1.5, \"big\": 1e300}, \"e\": [], \"eo\": {}}";

int main(void) {
    mt_json_t *v = NULL;
    CHECK_OK(mt_json_parse(doc, strlen(doc), "doc", &v));
    if (v) {
        const mt_json_t *a = mt_json_get(v, "a");
        CHECK(a && a->kind == MT_JSON_ARRAY && a->n == 6, "array of 6");
        CHECK(mt_json_at(a, 1) && mt_json_at(a, 1)->num == 2.5 && mt_json_at(a, 2)->num == -300.0, "numbers");
        CHECK(mt_json_at(a, 3)->kind == MT_JSON_BOOL && mt_json_at(a, 3)->b && !mt_json_at(a, 4)->b, "booleans");
        CHECK(mt_json_at(a, 5)->kind == MT_JSON_NULL && mt_json_at(a, 6) == NULL, "null, and no item 6");
        const char *s = mt_json_get_str(v, "s");
        CHECK(s && !strcmp(s, "x\"y\\z\n\xc3\xa9\xe2\x82\xac"), "escapes decoded: %s", s ? s : "(null)");
        const mt_json_t *o = mt_json_get(v, "o");
        int64_t k = 0;
        double f = 0;
        CHECK(mt_json_get_int(o, "k", &k) && k == INT64_C(9007199254740992), "2^53 is an integer");
        CHECK(!mt_json_get_int(o, "f", &k) && mt_json_get_num(o, "f", &f) && f == 1.5, "1.5 is not an integer");
        CHECK(!mt_json_get_int(o, "big", &k), "1e300 is not an int64");
        CHECK(!mt_json_get_int(o, "missing", &k) && !mt_json_get_str(o, "k"), "missing / wrong kind");
        CHECK(mt_json_get(v, "e")->n == 0 && mt_json_get(v, "eo")->kind == MT_JSON_OBJECT, "empty containers");
        mt_json_free(v);
    }
    /* every proper prefix of the document is malformed */
    size_t n = strlen(doc), refused = 0;
    for (size_t len = 0; len < n; len++) {
        mt_json_t *p = NULL;
        mt_status_t st = mt_json_parse(doc, len, "prefix", &p);
        refused += st == MT_ERR_INVALID_ARG && p == NULL && strstr(mt_last_error_msg(), "JSON syntax error at byte");
        mt_json_free(p);
    }
    CHECK(refused == n, "%zu of %zu truncations refused", refused, n);
    const char *bad[] = {"{\"a\" 1}", "[1,]",   "[1 2]",    "{\"a\":1} x", "\"\\q\"", "\"\\u12g4\"", "-", "1.2.3",
                         "tru",       "{1: 2}", "\"a\nb\"", "[",           "}"};
    for (size_t i = 0; i < MT_ARRAY_LEN(bad); i++) {
        mt_json_t *p = NULL;
        mt_status_t st = mt_json_parse(bad[i], strlen(bad[i]), "bad", &p);
        CHECK(st == MT_ERR_INVALID_ARG && !p, "refused: %s", bad[i]);
        mt_json_free(p);
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    mt_json_t *p = NULL;
    CHECK(mt_json_parse(deep, 200, "deep", &p) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "deeper than 64"),
          "nesting 100 deep refused: %s", mt_last_error_msg());
    CHECK_OK(mt_json_parse(deep + 40, 120, "60 deep", &p));
    mt_json_free(p);
    return mt_test_finish("test_json");
}
