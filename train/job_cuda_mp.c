/* The GPU engine's model parallelism (train/job_cuda.c is the engine): pipeline stages, each rank one stage
 * run by GPipe or 1F1B over the step's micro-batches with activations and their gradients sent by NCCL on the
 * compute stream, and tensor parallelism, the trainer's collectives over the tp group's NCCL communicator; and
 * the host communicator the gradient norm is summed over when the gradients span more than the dp group.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"

#include <stdlib.h>
#include <string.h>

#include "train/job.h"

#if MT_HAVE_CUDA
#include "train/job_cuda_impl.h"

/* Tensor parallelism, the trainer's collectives over the tp group on the stream it passes (its compute stream,
 * or for backward's input-gradient sums its tp stream, which the compute stream then waits for): sums of
 * activations or their gradients in the storage dtype (all-reduce, or with sequence parallelism reduce-scatter
 * and all-gather), of the LayerNorms' f32 gradients (sp), and the gather of the cross-entropy's statistics. Bytes
 * per rank in the bus convention the CPU engines count (parallel/tp.c): all-reduce 2b(n-1)/n of a b-byte buffer,
 * all-gather and reduce-scatter b(n-1)/n of the whole n x count buffer. */
static mt_status_t tp_all_reduce(void *arg, void *buf, size_t count, int dt, void *stream) {
    cuda_engine_t *e = arg;
    e->sent_tp += 2.0 * (double)count * (double)mt_dtype_size((mt_dtype_t)dt) * (e->tp - 1) / e->tp;
    return mt_coll_all_reduce(e->tpcomm, buf, buf, count, (mt_coll_dtype_t)dt, MT_REDOP_SUM, stream, NULL);
}

static mt_status_t tp_all_gather(void *arg, const void *send, void *recv, size_t count, int dt, void *stream) {
    cuda_engine_t *e = arg;
    e->sent_tp += (double)count * (double)mt_dtype_size((mt_dtype_t)dt) * (e->tp - 1);
    return mt_coll_all_gather(e->tpcomm, send, recv, count, (mt_coll_dtype_t)dt, stream, NULL);
}

static mt_status_t tp_reduce_scatter(void *arg, const void *send, void *recv, size_t count, int dt, void *stream) {
    cuda_engine_t *e = arg;
    e->sent_tp += (double)count * (double)mt_dtype_size((mt_dtype_t)dt) * (e->tp - 1);
    return mt_coll_reduce_scatter(e->tpcomm, send, recv, count, (mt_coll_dtype_t)dt, MT_REDOP_SUM, stream, NULL);
}
void cuda_engine_tp_ops(cuda_engine_t *e) {
    e->tp_ops = (mt_gpt2_cuda_tp_ops_t){.ctx = e,
                                        .all_reduce_sum = tp_all_reduce,
                                        .all_gather = tp_all_gather,
                                        .reduce_scatter_sum = tp_reduce_scatter};
}

/* The pipeline's communicators, collectively over info->comm: activations (device), scalars (host), and on
 * the first and last stage the tied wte's gradient (GPT-2's head reads wte; the MLP's has its own weight). */
mt_status_t cuda_engine_pp_comms_init(cuda_engine_t *e, const mt_job_info_t *info) {
    MT_CHECK(cuda_engine_axis_comms(e, info, MT_AXIS_PP, "pp-acts", "pp-scalars", e->pp, e->stage, "stage",
                                    &e->ppcomm, &e->pplcomm));
    if (mt_model_param(e->model, 0)->tied_module < 0) {
        return MT_OK;
    }
    if (e->pp == 2) {
        e->embcomm = e->ppcomm;
    } else if (e->first || e->last) {
        int me = 0, ranks[2];
        MPI_Comm_rank(info->comm, &me);
        mt_mesh_embedding_group(info->mesh, me, ranks);
        mt_comm_params_t ep = cuda_engine_dev_params(e, "pp-tied-wte");
        MT_CHECK(mt_comm_init_ranks(info->comm, ranks, 2, &ep, &e->embcomm));
    }
    return MT_OK;
}

/* The tp group's device communicator (the trainer's collectives), collectively over info->comm. */
mt_status_t cuda_engine_tp_comms_init(cuda_engine_t *e, const mt_job_info_t *info) {
    mt_comm_params_t cp = cuda_engine_dev_params(e, "tp-acts");
    return mt_comm_init_mesh(info->comm, info->mesh, MT_AXIS_BIT(MT_AXIS_TP), &cp, &e->tpcomm);
}

/* With gradients spread over more than one axis (tp; ZeRO with a pipeline): the host communicator over every
 * rank whose gradients make up the norm (tp, the pipeline's stages, under ZeRO the dp ranks' slices),
 * collectively over info->comm. */
mt_status_t cuda_engine_norm_comm_init(cuda_engine_t *e, const mt_job_info_t *info) {
    mt_comm_params_t np = MT_COMM_PARAMS_INIT;
    np.name = "grad-norm";
    unsigned axes = (e->tp > 1 ? MT_AXIS_BIT(MT_AXIS_TP) : 0u) | (e->pp > 1 ? MT_AXIS_BIT(MT_AXIS_PP) : 0u) |
                    (e->zero ? MT_AXIS_BIT(MT_AXIS_DP) : 0u);
    return mt_comm_init_mesh(info->comm, info->mesh, axes, &np, &e->normcomm);
}

/* One stage's schedule over the step's micro-batches: GPipe (every forward, then every backward from the
 * last) or 1F1B (pp - stage - 1 warm-up forwards, then one forward and one backward in turn, then the
 * remaining backwards). ops[i] = k + 1 for the forward of micro-batch k, -(k + 1) for its backward. */
static int pp_schedule(const cuda_engine_t *e, int m, int *ops) {
    int n = 0;
    if (e->sched == MT_PP_GPIPE) {
        for (int k = 0; k < m; k++) {
            ops[n++] = k + 1;
        }
        for (int k = m - 1; k >= 0; k--) {
            ops[n++] = -(k + 1);
        }
        return n;
    }
    int w = MT_MIN(e->pp - e->stage - 1, m), f = 0, b = 0;
    while (f < w) {
        ops[n++] = ++f;
    }
    while (f < m) {
        ops[n++] = ++f;
        ops[n++] = -(++b);
    }
    while (b < m) {
        ops[n++] = -(++b);
    }
    return n;
}

/* A send deferred to be posted together with the next op's receive (the 1F1B steady phase has neighbours
 * sending to each other at once; grouped, neither waits for the other), from the engine's send buffer. */
typedef struct {
    void *buf;
    int peer; /* -1: none */
} pp_send_t;

static mt_status_t pp_exchange(cuda_engine_t *e, pp_send_t *pend, void *rbuf, int rpeer) {
    mt_coll_dtype_t dt = (mt_coll_dtype_t)mt_prec_storage(e->prec);
    if (pend->peer < 0 && rpeer < 0) {
        return MT_OK;
    }
    MT_CHECK(mt_coll_group_start(e->ppcomm));
    mt_status_t st = MT_OK;
    if (pend->peer >= 0) {
        st = mt_coll_send(e->ppcomm, pend->buf, e->act_elems, dt, pend->peer, e->cstream, NULL);
        e->sent_pp += (double)e->act_elems * (double)mt_dtype_size((mt_dtype_t)dt);
    }
    if (st == MT_OK && rpeer >= 0) {
        st = mt_coll_recv(e->ppcomm, rbuf, e->act_elems, dt, rpeer, e->cstream, NULL);
    }
    mt_status_t end = mt_coll_group_end(e->ppcomm, e->cstream, NULL);
    pend->peer = -1;
    return st != MT_OK ? st : end;
}

/* The pipeline's forward (and backward) of one batch b on this stage, by the schedule, queued: activations
 * and their gradients through NCCL send/recv on the compute stream, each micro-batch in flight in its own
 * activation set of the trainer; on the last stage micro-batch k's mean loss into slots[k] on the device. */
mt_status_t cuda_engine_pp_queue_batch(cuda_engine_t *e, const mt_batch_t *b, bool backward, float *slots) {
    size_t n = (size_t)(e->mb * e->T), es = mt_dtype_size(mt_prec_storage(e->prec)), bytes = e->act_elems * es;
    int m = (int)e->ga, ops[2 * MT_JOB_CUDA_MAX_PP_MICROBATCHES];
    if (2 * m > (int)MT_ARRAY_LEN(ops)) {
        return mt_error(MT_ERR_INVALID_ARG, "cuda engine: %d micro-batches per step: at most %d in a pipeline", m,
                        (int)MT_ARRAY_LEN(ops) / 2);
    }
    int n_ops = backward ? pp_schedule(e, m, ops) : m, last_b = 0;
    for (int i = 0; !backward && i < m; i++) {
        ops[i] = i + 1;
    }
    for (int i = 0; i < n_ops; i++) {
        last_b = ops[i] < 0 ? i : last_b;
    }
    void *grad = mt_gpt2_cuda_stage_grad(e->g);
    pp_send_t pend = {NULL, -1};
    for (int i = 0; i < n_ops; i++) {
        int k = (ops[i] > 0 ? ops[i] : -ops[i]) - 1;
        const int32_t *tok = e->first ? b->inputs + (size_t)k * n : NULL;
        const int32_t *tgt = e->last ? b->targets + (size_t)k * n : NULL;
        /* micro-batch k's activations live in set k mod n_slots from its forward to its backward: the
         * schedule never has more micro-batches in flight */
        MT_CHECK(mt_gpt2_cuda_use_acts(e->g, k % e->n_slots));
        if (ops[i] > 0) { /* forward k: its input from the previous stage into the set, its output to the next */
            MT_CHECK(pp_exchange(e, &pend, mt_gpt2_cuda_stage_input(e->g), e->first ? -1 : e->stage - 1));
            MT_CHECK(mt_gpt2_cuda_forward(e->g, tok, tgt));
            void *out = mt_gpt2_cuda_stage_output(e->g);
            if (e->last) {
                CU(cudaMemcpyAsync(slots + k, mt_gpt2_cuda_loss_dev(e->g), 4, cudaMemcpyDeviceToDevice, e->cstream));
            } else {
                CU(cudaMemcpyAsync(e->sendbuf, out, bytes, cudaMemcpyDeviceToDevice, e->cstream));
                pend = (pp_send_t){e->sendbuf, e->stage + 1};
            }
            continue;
        }
        /* backward k: d x_hi from the next stage, with the last op's send */
        MT_CHECK(pp_exchange(e, &pend, grad, e->last ? -1 : e->stage + 1));
        e->final_pass = i == last_b; /* the step's last backward: the gradients are final */
        e->comm_now = e->gcomm && (e->zero2 || e->final_pass); /* ZeRO-2 takes every micro-batch's away */
        e->pend_lo = e->pend_hi = e->numel;
        mt_status_t st = mt_gpt2_cuda_backward(e->g, 1.0f / (float)e->ga);
        e->comm_now = false;
        MT_CHECK(st);
        if (!e->first) {
            CU(cudaMemcpyAsync(e->sendbuf, grad, bytes, cudaMemcpyDeviceToDevice, e->cstream));
            pend = (pp_send_t){e->sendbuf, e->stage - 1};
        }
    }
    return pp_exchange(e, &pend, NULL, -1);
}

#endif /* MT_HAVE_CUDA */
