/* Optional per-operation timers for the benchmark: off by default (one branch per call when off).
 * SPDX-License-Identifier: MIT */
#include "layers.h"
#include "runtime/mt_core.h"

static bool prof_on;
static double prof_s[MT_OP_COUNT];
static long prof_n[MT_OP_COUNT];

static const char *const op_names[MT_OP_COUNT] = {
    "matmul fwd",    "matmul bwd",    "layernorm fwd",  "layernorm bwd",  "gelu fwd",
    "gelu bwd",      "residual fwd",  "residual bwd",   "embedding fwd",  "embedding bwd",
    "attention fwd", "attention bwd", "softmax_ce fwd", "softmax_ce bwd",
};

void mt_layers_prof_enable(bool on) {
    prof_on = on;
}
void mt_layers_prof_reset(void) {
    for (int i = 0; i < MT_OP_COUNT; i++) {
        prof_s[i] = 0;
        prof_n[i] = 0;
    }
}
double mt_layers_prof_seconds(mt_op_t op, long *calls) {
    if (calls) {
        *calls = prof_n[op];
    }
    return prof_s[op];
}
const char *mt_layers_op_name(mt_op_t op) {
    return (unsigned)op < MT_OP_COUNT ? op_names[op] : "?";
}
double mt_layers_prof_begin(void) {
    return prof_on ? mt_now() : 0.0;
}
void mt_layers_prof_end(mt_op_t op, double t0) {
    if (prof_on) {
        prof_s[op] += mt_now() - t0;
        prof_n[op]++;
    }
}
