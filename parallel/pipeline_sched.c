/* The pipeline schedules, GPipe and 1F1B, over one stage's modules, and the tagged neighbour messages
 * they exchange. Every message carries its micro-batch in a trailing tag float (+(k+1) for the
 * activation of micro-batch k, -(k+1) for its gradient) that the receiver checks, so a schedule bug
 * shows up as an error naming both micro-batches instead of silently mixing data.
 *
 * GPipe (p = 3 stages, m = 4 micro-batches; F = forward, B = backward, time to the right):
 *   stage 0: F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
 *   stage 1:    F0 F1 F2 F3 .  .  B3 B2 B1 B0
 *   stage 2:       F0 F1 F2 F3 B3 B2 B1 B0
 * every stage holds all m micro-batches' activations at the turn.
 *
 * 1F1B (Megatron's non-interleaved schedule): stage s runs w = min(p - s - 1, m) warm-up forwards,
 * then alternates one forward and one backward, then drains the remaining backwards:
 *   stage 0: F0 F1 F2 .  B0 F3 B1 .  B2 .  B3
 *   stage 1:    F0 F1 .  B0 F2 B1 F3 B2 .  B3
 *   stage 2:       F0 B0 F1 B1 F2 B2 F3 B3
 * so stage s holds at most min(p - s, m) micro-batches at once. In the steady phase a forward's send
 * and the following backward's receive (and a backward's send and the next forward's receive) are
 * issued as one group, so two neighbours sending to each other at the same time cannot deadlock.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parallel/pipeline_impl.h"

/* One grouped exchange with the neighbours: an optional send and an optional receive, completed
 * together. Each side is {buffer, peer stage, micro-batch, is_grad}; buffer NULL = none. */
typedef struct {
    float *buf;
    int peer;
    int mb;
    bool grad;
} msg_t;

static const msg_t NO_MSG = {NULL, -1, -1, false};

static float tag_of(const msg_t *m) {
    return m->grad ? -(float)(m->mb + 1) : (float)(m->mb + 1);
}

static mt_status_t exchange(mt_pipeline_t pl, msg_t send, msg_t recv) {
    if (!send.buf && !recv.buf) {
        return MT_OK;
    }
    size_t n = pl->msg_floats;
    double t0 = mt_now();
    if (send.buf) {
        float tag = tag_of(&send);
        MT_CHECK(mt_device_copy(pl->dev, send.buf + n - 1, &tag, sizeof(float), pl->p.stream));
    }
    if (recv.buf) {
        MT_CHECK(mt_device_zero(pl->dev, recv.buf + n - 1, sizeof(float), pl->p.stream));
    }
    mt_work_t w = NULL;
    MT_CHECK(mt_coll_group_start(pl->pp_comm));
    if (send.buf) {
        MT_CHECK(mt_coll_send(pl->pp_comm, send.buf, n, MT_COLL_F32, send.peer, NULL, NULL));
    }
    if (recv.buf) {
        MT_CHECK(mt_coll_recv(pl->pp_comm, recv.buf, n, MT_COLL_F32, recv.peer, NULL, NULL));
    }
    MT_CHECK(mt_coll_group_end(pl->pp_comm, NULL, &w));
    mt_status_t st = mt_work_wait(w, pl->p.timeout_s > 0 ? pl->p.timeout_s : -1.0);
    mt_work_free(w);
    if (st != MT_OK) {
        char what[160] = "";
        if (send.buf) {
            snprintf(what, sizeof(what), "sending the %s of micro-batch %d to stage %d",
                     send.grad ? "gradient" : "activation", send.mb, send.peer);
        }
        if (recv.buf) {
            size_t l = strlen(what);
            snprintf(what + l, sizeof(what) - l, "%sreceiving the %s of micro-batch %d from stage %d", l ? " and " : "",
                     recv.grad ? "gradient" : "activation", recv.mb, recv.peer);
        }
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "pipeline stage %d: %s failed (%s): %s", pl->stage, what, mt_status_str(st), inner);
    }
    pl->stats.comm_wait_s += mt_now() - t0;
    if (send.buf) {
        pl->stats.n_sends++;
        pl->stats.bytes_sent += (int64_t)(n * sizeof(float));
    }
    if (recv.buf) {
        pl->stats.n_recvs++;
        float want = tag_of(&recv), got = 0.0f;
        MT_CHECK(mt_device_copy(pl->dev, &got, recv.buf + n - 1, sizeof(float), pl->p.stream));
        MT_CHECK(mt_device_wait(pl->dev, pl->p.stream));
        if (got != want) {
            return mt_error(MT_ERR_INTERNAL,
                            "pipeline stage %d: expected the %s of micro-batch %d from stage %d but the message is "
                            "tagged %s micro-batch %d",
                            pl->stage, recv.grad ? "gradient" : "activation", recv.mb, recv.peer,
                            got < 0 ? "gradient of" : "activation of", (int)fabsf(got) - 1);
        }
    }
    return MT_OK;
}

static bool is_first(mt_pipeline_t pl) {
    return pl->stage == 0;
}
static bool is_last(mt_pipeline_t pl) {
    return pl->stage == pl->n_stages - 1;
}

/* The four neighbour messages of micro-batch k (NO_MSG where the neighbour does not exist). */
static msg_t send_act(mt_pipeline_t pl, int k) {
    return is_last(pl) ? NO_MSG : (msg_t){pl->act_send, pl->stage + 1, k, false};
}
static msg_t recv_act(mt_pipeline_t pl, int k) {
    return is_first(pl) ? NO_MSG : (msg_t){pl->act_recv, pl->stage - 1, k, false};
}
static msg_t send_grad(mt_pipeline_t pl, int k) {
    return is_first(pl) ? NO_MSG : (msg_t){pl->grad_send, pl->stage - 1, k, true};
}
static msg_t recv_grad(mt_pipeline_t pl, int k) {
    return is_last(pl) ? NO_MSG : (msg_t){pl->grad_recv, pl->stage + 1, k, true};
}

/* Forward of micro-batch k on this stage's modules, input from act_recv (not on the first stage),
 * output to act_send (not on the last). Takes the micro-batch's activation slot. */
static mt_status_t forward(mt_pipeline_t pl, int k, const int32_t *tokens, const int32_t *targets) {
    int slot = k % pl->n_acts;
    /* The schedule's bound on held micro-batches is an invariant: a violation is a schedule bug. */
    MT_ASSERT(pl->busy[slot] == -1);
    MT_ASSERT(pl->in_flight < pl->n_acts);
    pl->busy[slot] = k;
    pl->in_flight++;
    if (pl->in_flight > pl->stats.max_in_flight) {
        pl->stats.max_in_flight = pl->in_flight;
    }
    size_t bt = (size_t)pl->p.micro_batch * (size_t)pl->p.seq_len;
    const int32_t *tok = is_first(pl) ? tokens + (size_t)k * bt : NULL;
    const int32_t *tgt = is_last(pl) ? targets + (size_t)k * bt : NULL;
    float loss = 0.0f;
    double t0 = mt_now();
    mt_status_t st =
        mt_model_forward(pl->model, pl->acts[slot], pl->lo, pl->hi, tok, tgt, is_first(pl) ? NULL : pl->act_recv,
                         is_last(pl) ? NULL : pl->act_send, is_last(pl) ? &loss : NULL);
    pl->stats.compute_s += mt_now() - t0;
    if (st != MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "pipeline stage %d: forward of micro-batch %d: %s", pl->stage, k, inner);
    }
    pl->loss_sum += loss;
    return MT_OK;
}

/* Backward of micro-batch k: gradient from grad_recv (not on the last stage), input gradient to
 * grad_send (not on the first). Frees the slot. */
static mt_status_t backward(mt_pipeline_t pl, int k) {
    int slot = k % pl->n_acts;
    MT_ASSERT(pl->busy[slot] == k);
    if (pl->in_flight == 1 && pl->stats.n_backward == pl->p.microbatches - 1) {
        mt_pipeline_begin_final_pass(pl);
    }
    pl->stats.n_backward++;
    double t0 = mt_now();
    mt_status_t st = mt_model_backward(pl->model, pl->acts[slot], pl->lo, pl->hi, is_last(pl) ? NULL : pl->grad_recv,
                                       is_first(pl) ? NULL : pl->grad_send, 1.0f / (float)pl->p.microbatches);
    pl->stats.compute_s += mt_now() - t0;
    if (st != MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "pipeline stage %d: backward of micro-batch %d: %s", pl->stage, k, inner);
    }
    pl->busy[slot] = -1;
    pl->in_flight--;
    return MT_OK;
}

static mt_status_t run_gpipe(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets) {
    int m = pl->p.microbatches;
    for (int k = 0; k < m; k++) {
        MT_CHECK(exchange(pl, NO_MSG, recv_act(pl, k)));
        MT_CHECK(forward(pl, k, tokens, targets));
        MT_CHECK(exchange(pl, send_act(pl, k), NO_MSG));
    }
    /* Backwards in reverse: the last forward's activations are the most recently touched. */
    for (int k = m - 1; k >= 0; k--) {
        MT_CHECK(exchange(pl, NO_MSG, recv_grad(pl, k)));
        MT_CHECK(backward(pl, k));
        MT_CHECK(exchange(pl, send_grad(pl, k), NO_MSG));
    }
    return MT_OK;
}

static mt_status_t run_1f1b(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets) {
    int m = pl->p.microbatches;
    int warm = pl->n_stages - pl->stage - 1;
    if (warm > m) {
        warm = m;
    }
    int rest = m - warm;
    for (int k = 0; k < warm; k++) {
        MT_CHECK(exchange(pl, NO_MSG, recv_act(pl, k)));
        MT_CHECK(forward(pl, k, tokens, targets));
        MT_CHECK(exchange(pl, send_act(pl, k), NO_MSG));
    }
    if (rest > 0) {
        MT_CHECK(exchange(pl, NO_MSG, recv_act(pl, warm)));
    }
    for (int i = 0; i < rest; i++) {
        int kf = warm + i, kb = i;
        MT_CHECK(forward(pl, kf, tokens, targets));
        MT_CHECK(exchange(pl, send_act(pl, kf), recv_grad(pl, kb)));
        MT_CHECK(backward(pl, kb));
        MT_CHECK(exchange(pl, send_grad(pl, kb), i == rest - 1 ? NO_MSG : recv_act(pl, kf + 1)));
    }
    for (int kb = rest; kb < m; kb++) {
        MT_CHECK(exchange(pl, NO_MSG, recv_grad(pl, kb)));
        MT_CHECK(backward(pl, kb));
        MT_CHECK(exchange(pl, send_grad(pl, kb), NO_MSG));
    }
    return MT_OK;
}

mt_status_t mt_pipeline_run_schedule(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets) {
    return pl->p.schedule == MT_PP_GPIPE ? run_gpipe(pl, tokens, targets) : run_1f1b(pl, tokens, targets);
}

mt_status_t mt_pipeline_run_forward(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets) {
    for (int k = 0; k < pl->p.microbatches; k++) {
        MT_CHECK(exchange(pl, NO_MSG, recv_act(pl, k)));
        MT_CHECK(forward(pl, k, tokens, targets));
        MT_CHECK(exchange(pl, send_act(pl, k), NO_MSG));
        pl->busy[k % pl->n_acts] = -1; /* no backward: the slot is free again */
        pl->in_flight--;
    }
    return MT_OK;
}
