/* Private parts of the data-parallel engines: the unit layout (buckets / module units), buffer pools,
 * the in-flight queue and the per-kind functions. engine.c dispatches, bucket.c lays out, comm.c counts
 * bytes and runs the hooks, dp.c / ddp.c / zero.c hold what differs per engine.
 * SPDX-License-Identifier: MIT */
#ifndef MT_ENGINE_IMPL_H
#define MT_ENGINE_IMPL_H

#include "parallel/engine.h"

#define ENG_ALIGN 16 /* floats: every unit (and so every shard) starts 64-byte aligned */

/* A unit is what one collective moves: a DDP/ZeRO-1/2 bucket, a ZeRO-3 module's parameters, the
 * ZeRO-3 persistent (whole) parameters. Its parameters are packed back to back in unit order and the
 * unit is padded to len: a multiple of N*ENG_ALIGN when sharded (rank r owns [r*shard, (r+1)*shard)),
 * of ENG_ALIGN when replicated. */
typedef enum { UNIT_REPL = 0, UNIT_SHARD = 1 } unit_kind_t;

typedef struct {
    unit_kind_t kind;
    int p0, np;               /* parameters: e->unit_params[p0 .. p0 + np) */
    size_t numel, len, shard; /* real elements, padded length, len / N (SHARD) */
    size_t base;              /* offset in the full flat buffers (units that have full storage) */
    size_t sbase;             /* offset of this rank's shard in the shard buffers (SHARD) */
    bool full;                /* has full storage in e->pflat / e->gflat */
    bool once;                /* ZeRO-2/3: communicates on the step's last pass only (MT_ENGINE_PARAM_ONCE) */
    int pending;              /* parameters whose gradient is incomplete in this backward pass */
    bool launched;            /* gradient collective issued in this pass */
    mt_work_t gwork;          /* that collective, while in flight */
    float *gslot;             /* ZeRO-2/3: the bucket buffer this pass's gradient accumulates into */
    float *pslot;             /* ZeRO-3: the gathered parameters */
    int pstate;               /* ZeRO-3: 0 released, 1 gathering, 2 ready */
    mt_work_t pwork;
    double t_launch, t_done; /* last pass: gradient collective issued / seen complete */
    double trace_us;         /* launch on the trace clock (profile.trace) */
} unit_t;

/* Buffers handed out and taken back (bucket buffers, gathered parameters): best fit among the free
 * ones; grows on demand with a buffer of exactly the size asked for. */
typedef struct {
    float **bufs;
    size_t *sizes; /* floats of each buffer */
    bool *busy;
    int n, cap;
    size_t floats;         /* the largest request it will see (largest sharded unit) */
    int64_t bytes, peak;   /* allocator bytes held now / at most */
    mt_device_table_t dev; /* where the buffers live (the engine's device) */
    void *stream;
    const char *owner;
} pool_t;

struct engine_ops;

struct mt_engine {
    mt_engine_params_t p;
    const struct engine_ops *ops;
    char name[16];
    mt_model_t model;
    mt_comm_t comm;
    int rank, size;
    int n_params, n_modules;
    int stage; /* 0 for DP / DDP */

    /* layout */
    unit_t *units;
    int n_units;
    int *unit_params;  /* parameter indices grouped by unit */
    int *param_unit;   /* parameter -> unit */
    size_t *param_pos; /* parameter -> element offset in its unit */
    size_t flat_len;   /* elements of the full buffers (sum of len over full units) */
    size_t shard_len;  /* elements of the shard buffers (sum of shard over SHARD units) */
    int *mod_off;      /* CSR: module m's SHARD units (params it owns or reads tied) are */
    int *mod_units;    /*   mod_units[mod_off[m] .. mod_off[m + 1]) */

    mt_device_table_t dev; /* p.device, or the CPU table */
    void *stream;          /* p.stream */
    double *dsum;          /* one device double: eng_sumsq's result when the device is not the host */

    /* storage (on dev) */
    float *pflat, *gflat;   /* full parameters / gradients of full units */
    float *pshard, *gshard; /* this rank's shard (ZeRO-2: gradients; ZeRO-3: both) */
    pool_t gpool, ppool;    /* ZeRO-2/3 bucket buffers; ZeRO-3 gathered parameters */
    mt_optim_t opt;
    /* optimizer tensor j holds parameter piece_param[j]'s unit elements [piece_lo[j], piece_hi[j]) */
    int *piece_param;
    size_t *piece_lo, *piece_hi;
    int n_pieces;

    /* step state */
    int micro; /* backward passes begun since zero_grads */
    int last_bwd_module;
    bool in_backward;
    int *fifo; /* gradient collectives in flight, in issue order (unit indices) */
    int fifo_head, fifo_n;
    mt_engine_comm_stats_t cur, last;
    bool counting;       /* count bytes (off inside gather_params) */
    double scalar[2];    /* send/receive buffers of the loss and norm all-reduces (engine-owned: a timed-out
                          * collective may still write into them) */
    mt_work_t stuck[16]; /* collectives whose wait failed, waited again by mt_engine_free */
    int n_stuck;
    int64_t plan_bytes; /* mt_engine_plan_mem's accumulator */
};

/* What differs per engine kind; NULL entries fall back to the common behaviour in comm.c/engine.c. */
typedef struct engine_ops {
    mt_status_t (*layout)(mt_engine_t e); /* builds e->units */
    mt_status_t (*zero_grads)(mt_engine_t e);
    mt_status_t (*finish_grads)(mt_engine_t e);
    mt_status_t (*grad_sumsq)(mt_engine_t e, double *local);
    mt_status_t (*step)(mt_engine_t e, float lr, float grad_scale);
} engine_ops_t;

extern const engine_ops_t mt_engine_dp_ops, mt_engine_ddp_ops, mt_engine_zero_ops;

/* Whether the engine lays out parameter i (params.param_flags HELD; every parameter without flags). */
static inline bool eng_held(const struct mt_engine *e, int i) {
    return !e->p.param_flags || (e->p.param_flags[i] & MT_ENGINE_PARAM_HELD);
}
static inline bool eng_flag(const struct mt_engine *e, int i, unsigned f) {
    return e->p.param_flags && (e->p.param_flags[i] & f);
}

/* bucket.c: layouts */
mt_status_t eng_layout_buckets(mt_engine_t e, unit_kind_t kind); /* reverse registration order */
mt_status_t eng_layout_one(mt_engine_t e);                       /* one replicated unit (DP) */
mt_status_t eng_layout_modules(mt_engine_t e);                   /* ZeRO-3 module units + persistent */
mt_status_t eng_layout_finish(mt_engine_t e);                    /* lengths, offsets, CSR, param maps */
mt_status_t eng_alloc_storage(mt_engine_t e);
/* bytes of zeroed storage on the engine's device (NULL on failure, the error set). */
void *eng_dev_calloc(mt_engine_t e, size_t bytes, mt_mem_cat_t cat, const char *owner);
/* *acc (host) += the sum of squares of n device floats (the CPU table: mt_clip_sumsq's value, bit for bit;
 * another device: its sum copied back, the host waiting for it). */
mt_status_t eng_sumsq_add(mt_engine_t e, const float *x, size_t n, double *acc);
mt_status_t eng_init_values(mt_engine_t e);    /* initial weights, consistent over ranks */
mt_status_t eng_register_optim(mt_engine_t e); /* what this rank owns */
void eng_bind_full(mt_engine_t e);             /* p->data / p->grad into full buffers */
size_t eng_round_up(size_t n, size_t m);

/* comm.c: counted collectives, pools, in-flight queue, hooks */
mt_status_t eng_all_reduce(mt_engine_t e, bool model, const void *send, void *recv, size_t count, mt_coll_dtype_t dt,
                           mt_redop_t op, mt_work_t *work);
mt_status_t eng_reduce_scatter(mt_engine_t e, const void *send, void *recv, size_t count, mt_work_t *work);
mt_status_t eng_all_gather(mt_engine_t e, const void *send, void *recv, size_t count, mt_work_t *work);
mt_status_t eng_broadcast(mt_engine_t e, bool model, void *buf, size_t count, mt_coll_dtype_t dt, int root);
mt_status_t eng_reduce(mt_engine_t e, void *buf, size_t count, int root);
void eng_count_send(mt_engine_t e, bool model, double bytes);
mt_status_t eng_wait(mt_engine_t e, mt_work_t *work); /* waits, frees, adds to wait_s */
void eng_keep_stuck(mt_engine_t e, mt_work_t w);      /* a failed wait: mt_engine_free retries */

float *pool_get(pool_t *pl, size_t floats); /* NULL: none free that fits (caller may pool_grow) */
mt_status_t pool_grow(pool_t *pl, size_t floats, float **out);
void pool_put(pool_t *pl, float *buf);
void pool_free(pool_t *pl);
int64_t pool_bytes(const pool_t *pl);

mt_status_t eng_launch_grad(mt_engine_t e, int u); /* the unit's gradient collective, asynchronous */
mt_status_t eng_poll(mt_engine_t e);               /* completes finished collectives at the queue head */
mt_status_t eng_drain(mt_engine_t e);              /* waits for every gradient collective in flight */
mt_status_t eng_finish_common(mt_engine_t e);      /* launch what was not launched, then drain */
bool eng_unit_comms_this_pass(mt_engine_t e, int u);
void eng_install_hooks(mt_engine_t e);
mt_status_t eng_release_params(mt_engine_t e, int u); /* ZeRO-3 */
mt_status_t eng_release_all_params(mt_engine_t e);

#endif /* MT_ENGINE_IMPL_H */
