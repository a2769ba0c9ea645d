/* AdamW and SGD with momentum over registered fp32 buffers, global-norm clipping and LR schedules,
 * each written to reproduce torch.optim / torch.nn.utils arithmetic operation for operation in fp32.
 * SPDX-License-Identifier: MIT */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/alloc.h"
#include "runtime/device.h"

typedef struct {
    char *name;
    float *param;
    const float *grad;
    size_t n;
    bool decay;
    float *m; /* AdamW first moment / SGD momentum buffer */
    float *v; /* AdamW second moment */
} optim_tensor_t;

struct mt_optim {
    mt_optim_params_t p;
    mt_device_table_t dev; /* where the state lives and the steps run */
    void *stream;
    int64_t t;
    int n, cap;
    optim_tensor_t *tensors;
};

mt_status_t mt_optim_init(const mt_optim_params_t *params, mt_optim_t *out) {
    *out = NULL;
    if (!params || params->size != sizeof(mt_optim_params_t)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_optim_init: params missing or .size not set (use MT_OPTIM_PARAMS_INIT)");
    }
    const mt_optim_params_t *p = params;
    if (p->kind != MT_OPTIM_ADAMW && p->kind != MT_OPTIM_SGD) {
        return mt_error(MT_ERR_INVALID_ARG, "optimizer kind %d is neither adamw nor sgd", (int)p->kind);
    }
    if (p->kind == MT_OPTIM_ADAMW) {
        if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f) || !(p->beta2 >= 0.0f && p->beta2 < 1.0f)) {
            return mt_error(MT_ERR_INVALID_ARG, "AdamW betas must be in [0, 1): beta1 = %g, beta2 = %g", p->beta1,
                            p->beta2);
        }
        if (!(p->eps >= 0.0f)) {
            return mt_error(MT_ERR_INVALID_ARG, "AdamW eps must be >= 0 (got %g)", p->eps);
        }
    }
    if (!(p->weight_decay >= 0.0f)) {
        return mt_error(MT_ERR_INVALID_ARG, "weight_decay must be >= 0 (got %g)", p->weight_decay);
    }
    if (!(p->momentum >= 0.0f && p->momentum < 1.0f)) {
        return mt_error(MT_ERR_INVALID_ARG, "SGD momentum must be in [0, 1) (got %g)", p->momentum);
    }
    struct mt_optim *o = calloc(1, sizeof(*o));
    if (!o) {
        return mt_error(MT_ERR_OOM, "mt_optim_init: out of memory");
    }
    o->p = *p;
    o->dev = mt_device_cpu();
    *out = o;
    return MT_OK;
}

int mt_optim_state_buffers(const mt_optim_params_t *p) {
    return p->kind == MT_OPTIM_ADAMW ? 2 : (p->momentum > 0.0f ? 1 : 0);
}

mt_status_t mt_optim_set_device(mt_optim_t opt, mt_device_table_t dev, void *stream) {
    if (!opt || !dev || opt->n > 0) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_optim_set_device: %s",
                        !opt || !dev ? "NULL optimizer or device" : "tensors already registered");
    }
    opt->dev = dev;
    opt->stream = stream;
    return MT_OK;
}

/* n zeroed floats of optimizer state on the optimizer's device; NULL when out of memory. */
static float *state_buffer(mt_optim_t opt, size_t n, const char *owner) {
    void *b = NULL;
    return mt_device_calloc(opt->dev, &b, n * sizeof(float), MT_MEM_OPTIMIZER, owner, opt->stream) == MT_OK ? b : NULL;
}

mt_status_t mt_optim_add(mt_optim_t opt, const char *name, float *param, const float *grad, size_t n, bool decay,
                         int *index) {
    if (!opt || (n > 0 && (!param || !grad))) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_optim_add(%s): NULL optimizer, parameter or gradient",
                        name ? name : "?");
    }
    if (opt->n == opt->cap) {
        int cap = opt->cap ? 2 * opt->cap : 16;
        optim_tensor_t *nt = realloc(opt->tensors, (size_t)cap * sizeof(*nt));
        if (!nt) {
            return mt_error(MT_ERR_OOM, "mt_optim_add: out of memory");
        }
        opt->tensors = nt;
        opt->cap = cap;
    }
    optim_tensor_t t = {.param = param, .grad = grad, .n = n, .decay = decay};
    t.name = strdup(name ? name : "");
    int nbuf = mt_optim_state_buffers(&opt->p); /* m, then v */
    bool need_m = nbuf >= 1, need_v = nbuf >= 2;
    if (need_m) {
        t.m = state_buffer(opt, n, "optim.m");
    }
    if (need_v) {
        t.v = state_buffer(opt, n, "optim.v");
    }
    if (!t.name || (need_m && !t.m) || (need_v && !t.v)) {
        mt_device_free(opt->dev, t.m);
        mt_device_free(opt->dev, t.v);
        free(t.name);
        return mt_error(MT_ERR_OOM, "optimizer state for %s (%zu elements): out of memory", name ? name : "?", n);
    }
    if (index) {
        *index = opt->n;
    }
    opt->tensors[opt->n++] = t;
    return MT_OK;
}

mt_status_t mt_optim_step(mt_optim_t opt, float lr, float grad_scale) {
    if (!opt) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_optim_step: NULL optimizer");
    }
    if (!isfinite(lr) || !isfinite(grad_scale)) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_optim_step: non-finite lr (%g) or gradient scale (%g)", lr, grad_scale);
    }
    opt->t++;
    const mt_optim_params_t *p = &opt->p;
    mt_device_step_t s = {.sgd = p->kind == MT_OPTIM_SGD,
                          .lr = lr,
                          .beta1 = p->beta1,
                          .beta2 = p->beta2,
                          .eps = p->eps,
                          .momentum = p->momentum,
                          .t = opt->t,
                          .first = opt->t == 1,
                          .grad_scale = grad_scale};
    for (int i = 0; i < opt->n; i++) {
        optim_tensor_t *t = &opt->tensors[i];
        s.weight_decay = t->decay ? p->weight_decay : 0.0f;
        MT_CHECK(mt_device_step(opt->dev, &s, t->param, t->grad, t->m, t->v, t->n, opt->stream));
    }
    return MT_OK;
}

int64_t mt_optim_get_step(mt_optim_t opt) {
    return opt->t;
}

void mt_optim_set_step(mt_optim_t opt, int64_t t) {
    opt->t = t;
}

int mt_optim_count(mt_optim_t opt) {
    return opt ? opt->n : 0;
}

mt_status_t mt_optim_state(mt_optim_t opt, int i, const char **name, size_t *n, float **m, float **v) {
    if (!opt || i < 0 || i >= opt->n) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_optim_state: tensor index %d out of range [0, %d)", i,
                        opt ? opt->n : 0);
    }
    const optim_tensor_t *t = &opt->tensors[i];
    if (name) {
        *name = t->name;
    }
    if (n) {
        *n = t->n;
    }
    if (m) {
        *m = t->m;
    }
    if (v) {
        *v = t->v;
    }
    return MT_OK;
}

void mt_optim_free(mt_optim_t opt) {
    if (!opt) {
        return;
    }
    for (int i = 0; i < opt->n; i++) {
        mt_device_free(opt->dev, opt->tensors[i].m);
        mt_device_free(opt->dev, opt->tensors[i].v);
        free(opt->tensors[i].name);
    }
    free(opt->tensors);
    free(opt);
}

/* ---- schedules ------------------------------------------------------------------------------------ */

float mt_lr_at(const mt_lr_sched_t *s, int64_t step) {
    if (step < 0) {
        step = 0;
    }
    if (step < s->warmup_steps) {
        return (float)((double)s->lr * (double)(step + 1) / (double)s->warmup_steps);
    }
    if (s->kind == MT_LR_CONSTANT) {
        return s->lr;
    }
    int64_t span = s->total_steps - 1 - s->warmup_steps;
    double r = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 0.0;
    if (r > 1.0) {
        r = 1.0;
    }
    double coeff = 0.5 * (1.0 + cos(M_PI * r));
    return (float)((double)s->min_lr + coeff * ((double)s->lr - (double)s->min_lr));
}

bool mt_lr_kind_parse(const char *s, mt_lr_kind_t *out) {
    if (s && !strcmp(s, "constant")) {
        *out = MT_LR_CONSTANT;
        return true;
    }
    if (s && !strcmp(s, "cosine")) {
        *out = MT_LR_COSINE;
        return true;
    }
    return false;
}
