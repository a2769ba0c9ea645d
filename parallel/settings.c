/* mt_settings_read: the one place the parallel.*, precision.* and optimizer.* keys are read.
 * SPDX-License-Identifier: MIT */
#include "parallel/settings.h"

#include <string.h>

static mt_status_t bad_choice(const char *key, const char *value, const char *choices) {
    return mt_error(MT_ERR_INVALID_ARG, "%s = \"%s\": expected %s", key, value, choices);
}

static mt_status_t read_parallel(const mt_config_t *cfg, mt_parallel_settings_t *p) {
    p->tp = (int)mt_config_int(cfg, "parallel.tp");
    p->pp = (int)mt_config_int(cfg, "parallel.pp");
    p->dp = (int)mt_config_int(cfg, "parallel.dp");
    p->order = mt_config_str(cfg, "parallel.order");
    const char *engine = mt_config_str(cfg, "parallel.engine");
    if (!mt_engine_kind_parse(engine, &p->engine)) {
        return bad_choice("parallel.engine", engine, "\"dp\", \"ddp\" or \"zero\"");
    }
    p->zero_stage = (int)mt_config_int(cfg, "parallel.zero_stage");
    p->bucket_mb = mt_config_float(cfg, "parallel.bucket_mb");
    p->bucket_mb_set = mt_config_source(cfg, "parallel.bucket_mb") != MT_CFG_SRC_DEFAULT;
    p->persist_threshold = mt_config_int(cfg, "parallel.zero_persist_threshold");
    p->persist_threshold_set = mt_config_source(cfg, "parallel.zero_persist_threshold") != MT_CFG_SRC_DEFAULT;
    const char *schedule = mt_config_str(cfg, "parallel.schedule");
    if (!mt_pp_schedule_parse(schedule, &p->schedule)) {
        return bad_choice("parallel.schedule", schedule, "\"gpipe\" or \"1f1b\"");
    }
    p->microbatches = mt_config_int(cfg, "parallel.microbatches");
    p->stage_layers = mt_config_str(cfg, "parallel.stage_layers");
    p->sequence_parallel = mt_config_bool(cfg, "parallel.sequence_parallel");
    p->tp_comm_chunks = (int)mt_config_int(cfg, "parallel.tp_comm_chunks");
    p->tp_comm_chunks_set = mt_config_source(cfg, "parallel.tp_comm_chunks") != MT_CFG_SRC_DEFAULT;
    const char *reduce = mt_config_str(cfg, "parallel.dp_reduce");
    static const char *reduces[] = {"auto", "engine", "allreduce"};
    int r = 0;
    while (r < 3 && strcmp(reduce, reduces[r]) != 0) {
        r++;
    }
    if (r == 3) {
        return bad_choice("parallel.dp_reduce", reduce, "\"auto\", \"engine\" or \"allreduce\"");
    }
    p->dp_reduce = (mt_dp_reduce_t)r;
    return MT_OK;
}

static mt_status_t read_optimizer(const mt_config_t *cfg, mt_settings_t *s) {
    mt_optim_params_t o = MT_OPTIM_PARAMS_INIT;
    const char *kind = mt_config_str(cfg, "optimizer.kind");
    if (strcmp(kind, "adamw") != 0 && strcmp(kind, "sgd") != 0) {
        return bad_choice("optimizer.kind", kind, "\"adamw\" or \"sgd\"");
    }
    o.kind = strcmp(kind, "sgd") ? MT_OPTIM_ADAMW : MT_OPTIM_SGD;
    o.beta1 = (float)mt_config_float(cfg, "optimizer.beta1");
    o.beta2 = (float)mt_config_float(cfg, "optimizer.beta2");
    o.eps = (float)mt_config_float(cfg, "optimizer.eps");
    o.weight_decay = (float)mt_config_float(cfg, "optimizer.weight_decay");
    o.momentum = (float)mt_config_float(cfg, "optimizer.momentum");
    s->optim = o;
    mt_lr_sched_t l = {0};
    const char *schedule = mt_config_str(cfg, "optimizer.schedule");
    if (!mt_lr_kind_parse(schedule, &l.kind)) {
        return bad_choice("optimizer.schedule", schedule, "\"constant\" or \"cosine\"");
    }
    l.lr = (float)mt_config_float(cfg, "optimizer.lr");
    l.min_lr = (float)mt_config_float(cfg, "optimizer.min_lr");
    l.warmup_steps = mt_config_int(cfg, "optimizer.warmup_steps");
    l.total_steps = mt_config_int(cfg, "train.steps");
    s->lr = l;
    s->grad_clip = (float)mt_config_float(cfg, "optimizer.grad_clip");
    int64_t eval = mt_config_int(cfg, "train.eval_batches");
    s->eval_chunk = mt_config_int(cfg, "train.eval_every") <= 0 ? 0 : MT_MIN(eval, (int64_t)MT_SETTINGS_EVAL_CHUNK);
    return MT_OK;
}

mt_status_t mt_settings_read(const mt_config_t *cfg, mt_settings_t *out) {
    memset(out, 0, sizeof(*out));
    MT_CHECK(read_parallel(cfg, &out->par));
    const char *compute = mt_config_str(cfg, "precision.compute");
    if (!mt_prec_parse(compute, &out->prec.compute)) {
        return bad_choice("precision.compute", compute, "fp32, tf32, bf16 or fp16");
    }
    out->prec.init_scale = (float)mt_config_float(cfg, "precision.init_scale");
    out->prec.scale_window = mt_config_int(cfg, "precision.scale_window");
    const char *matmul = mt_config_str(cfg, "runtime.matmul");
    if (!mt_matmul_parse(matmul, &out->cpu.matmul)) {
        return bad_choice("runtime.matmul", matmul, "\"auto\", \"openblas\" or \"onednn\"");
    }
    const char *kernels = mt_config_str(cfg, "runtime.cpu_kernels");
    if (strcmp(kernels, "auto") && strcmp(kernels, "baseline")) {
        return bad_choice("runtime.cpu_kernels", kernels, "\"auto\" or \"baseline\"");
    }
    out->cpu.baseline_kernels = strcmp(kernels, "baseline") == 0;
    return read_optimizer(cfg, out);
}

bool mt_settings_dp_engine(const mt_parallel_settings_t *p, int dp) {
    return p->dp_reduce == MT_DP_REDUCE_ENGINE || (p->dp_reduce == MT_DP_REDUCE_AUTO && dp > 1);
}
