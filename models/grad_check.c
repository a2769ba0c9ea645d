/* Per-module non-finite gradient scan and the NaN injection test knob (grad_check.h).
 * SPDX-License-Identifier: MIT */
#include "models/grad_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/numerics.h"

MT_PARAM(test_nan_step, "TEST_NAN_STEP", 0)
MT_PARAM(test_nan_rank, "TEST_NAN_RANK", 0)
MT_PARAM_STR(test_nan_module, "TEST_NAN_MODULE", NULL)

int mt_model_first_nonfinite_grad(mt_model_t m, char *param, size_t n) {
    int best = -1;
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *p = mt_model_param(m, i);
        int module = MT_MAX(p->module, p->tied_module);
        if (!p->grad || module <= best || mt_f32_all_finite(p->grad, p->numel)) {
            continue;
        }
        best = module;
        if (param && n > 0) {
            snprintf(param, n, "%s", p->name);
        }
    }
    if (best < 0 && param && n > 0) {
        param[0] = '\0';
    }
    return best;
}

bool mt_model_test_inject_nan(mt_model_t m, int64_t step, int rank) {
    int64_t at = mt_param_test_nan_step(), who = mt_param_test_nan_rank();
    if (at <= 0 || step != at || (who >= 0 && who != rank)) {
        return false;
    }
    int module = mt_model_n_modules(m) - 1;
    const char *name = mt_param_test_nan_module();
    if (name && *name) {
        for (module = mt_model_n_modules(m) - 1; module >= 0; module--) {
            if (!strcmp(mt_model_module_name(m, module), name)) {
                break;
            }
        }
        if (module < 0) {
            MT_WARN("MESHTRAIN_TEST_NAN_MODULE=%s: no such module; nothing injected", name);
            return false;
        }
    }
    int first = 0, count = 0;
    mt_model_module_params(m, module, &first, &count);
    if (count == 0 || !mt_model_param(m, first)->grad) {
        return false;
    }
    mt_model_param(m, first)->grad[0] = NAN;
    MT_WARN("test knob: NaN injected into the gradient of %s (module %s) at step %lld on rank %d",
            mt_model_param(m, first)->name, mt_model_module_name(m, module), (long long)step, rank);
    return true;
}
