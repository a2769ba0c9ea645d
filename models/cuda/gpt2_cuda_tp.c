/* The device GPT-2's tensor-parallel region boundaries (the CPU's models/gpt2/gpt2_tp.c), each collective in
 * the compute stream's order: the reductions and gathers of Megatron's f and g, and the row- and column-parallel
 * products with their collectives chunked to overlap (params.tp_chunks). models/cuda/gpt2_cuda_pass.c calls them.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/gpt2_cuda_impl.h"

/* Tensor parallelism, the region boundaries (gpt2_tp.c), each collective in the compute stream's order.
 * g forward and f backward: part (N,C) holds this rank's partial sums; *out the group's sum: part itself (an
 * in-place all-reduce; nothing with tp = 1) or, with sequence parallelism, this rank's R rows of it at rows
 * (a reduce-scatter). */
static mt_status_t tp_reduce_on(mt_gpt2_cuda_t g, void *part, void *rows, void **out, cudaStream_t s) {
    *out = part;
    if (g->tp == 1) {
        return MT_OK;
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    size_t C = (size_t)g->C;
    if (!g->sp) {
        MT_CHECK(o->all_reduce_sum(o->ctx, part, (size_t)g->N * C, g->dt, s));
    } else {
        MT_CHECK(o->reduce_scatter_sum(o->ctx, part, rows, (size_t)g->R * C, g->dt, s));
        *out = rows;
    }
    return MT_OK;
}

mt_status_t gpt2_cuda_tp_reduce(mt_gpt2_cuda_t g, void *part, void *rows, void **out) {
    MT_CHECK(tp_reduce_on(g, part, rows, out, g->stream));
    return g->tp > 1 ? gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP) : MT_OK;
}

/* The compute stream waits for the reduction tp_reduce_async left pending, if any (at the start of a forward
 * or backward: one a failed backward left unjoined), before anything else writes its buffers or uses the tp
 * group. */
mt_status_t gpt2_cuda_tp_rejoin(mt_gpt2_cuda_t g) {
    if (g->tp_pending) {
        g->tp_pending = false;
        CK(cudaStreamWaitEvent(g->stream, g->tp_out, 0));
    }
    return MT_OK;
}

/* Backward, after a column-parallel product's input gradient (part) and before its weight gradient: the
 * reduction starts on tp_stream once part is complete, and the compute stream goes on with the weight
 * gradient, which reads neither part nor rows (Megatron's overlap of the input gradient's all-reduce with the
 * weight gradient). tp_join puts the compute stream behind it, before anything reads *out or the tp group
 * runs another collective (so the group's calls keep one order on every rank). */
mt_status_t gpt2_cuda_tp_reduce_async(mt_gpt2_cuda_t g, void *part, void *rows, void **out) {
    if (g->tp == 1) {
        *out = part;
        return MT_OK;
    }
    MT_CHECK(gpt2_cuda_tp_rejoin(g));
    CK(cudaEventRecord(g->tp_in, g->stream));
    CK(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0));
    mt_status_t st = tp_reduce_on(g, part, rows, out, g->tp_stream);
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    if (st != MT_OK) { /* what was queued there must not outlive the call unordered: finish it */
        cudaStreamSynchronize(g->tp_stream);
        return st;
    }
    g->tp_pending = true;
    return MT_OK;
}

/* The compute stream waits for the reduction tp_reduce_async started; the profile's TP time is then what the
 * weight gradient did not hide. */
mt_status_t gpt2_cuda_tp_join(mt_gpt2_cuda_t g) {
    bool pending = g->tp_pending;
    MT_CHECK(gpt2_cuda_tp_rejoin(g));
    return pending ? gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP) : MT_OK;
}

/* f forward and g backward with sequence parallelism: every rank's R rows at rows into full (N,C), in rank
 * order; without it rows is full already. */
mt_status_t gpt2_cuda_tp_gather(mt_gpt2_cuda_t g, const void *rows, void *full) {
    if (!g->sp) {
        return MT_OK;
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    MT_CHECK(o->all_gather(o->ctx, rows, full, (size_t)g->R * g->C, g->dt, g->stream));
    return gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
}

/* Chunk j of k over `rows` rows: its first row *j0 and its row count, which is 0 when there are more chunks than
 * rows (the same on every rank, so every rank skips the same chunks). */
static int chunk_rows(int rows, int k, int j, int *j0) {
    *j0 = (int)((int64_t)rows * j / k);
    return (int)((int64_t)rows * (j + 1) / k) - *j0;
}

/* Forward, a row-parallel product into g->tmp_c (inp (N, Cin): this rank's heads or MLP columns; w its rows of the
 * weight; bias tp rank 0's) and its reduction over tp (g), *x as gpt2_cuda_tp_reduce gives it. With params.tp_chunks =
 * k > 1 the rows go in k chunks: chunk j's collective starts on tp_stream as soon as its product is written and runs
 * while the compute stream computes chunk j + 1, and the compute stream waits for the last before anything reads
 * *x (the row-parallel output's communication overlapped with its product: only the last chunk's is exposed).
 * With sequence parallelism chunk j holds, for each rank r, rows [j0, j1) of r's R rows (one product per rank),
 * packed rank after rank, so its reduce-scatter leaves rows [j0, j1) of this rank's R at the same rows of
 * tmp_r. Each row's product is the unchunked one's, and each element's sum is over the same ranks. */
mt_status_t gpt2_cuda_rowpar_forward(mt_gpt2_cuda_t g, const void *inp, int Cin, const void *w, const void *bias,
                                     void **x) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (tp == 1 || k <= 1) {
        OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, g->tmp_c, C, NULL, inp, w, bias, N, Cin, C, dt, s));
        return gpt2_cuda_tp_reduce(g, g->tmp_c, g->tmp_r, x);
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    const char *in = inp;
    char *out = g->tmp_c;
    size_t es = g->es;
    int rows = g->sp ? R : N; /* what is cut into chunks: each rank's R rows, or all N */
    bool queued = false;      /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = MT_OK;
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(rows, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = out + (size_t)(g->sp ? tp : 1) * (size_t)j0 * C * es;
        for (int r = 0; r < (g->sp ? tp : 1) && st == MT_OK; r++) { /* r > 0 only with sequence parallelism */
            st = mt_cuda_status(mt_cuda_matmul_forward(g->ctx, pack + (size_t)r * n * C * es, C, NULL,
                                                       in + ((size_t)r * R + j0) * Cin * es, w, bias, n, Cin,
                                                       C, dt, s),
                                "row-parallel product");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_FWD);
        }
        st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event");
        st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
        if (st == MT_OK) {
            queued = true;
            st = g->sp ? o->reduce_scatter_sum(o->ctx, pack, (char *)g->tmp_r + (size_t)j0 * C * es, (size_t)n * C,
                                               dt, g->tp_stream)
                       : o->all_reduce_sum(o->ctx, pack, (size_t)n * C, dt, g->tp_stream);
        }
    }
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(s, g->tp_out, 0), "tp event wait");
    if (st != MT_OK) {
        if (queued) {
            cudaStreamSynchronize(g->tp_stream);
        }
        return st;
    }
    *x = g->sp ? g->tmp_r : g->tmp_c;
    return gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
}

/* Sequence parallelism with params.tp_chunks > 1, one chunk of a gather (f forward, g backward): rows [j0, j0 + n)
 * of every rank's R rows at src gathered on tp_stream into pack, rank after rank, the compute stream put behind
 * it, and rank r's n rows copied to rows r R + j0 of full (N,C). The caller has ordered tp_stream after src's
 * writer and after pack's last reader; *queued is set once a collective is on tp_stream. */
static mt_status_t sp_gather_chunk(mt_gpt2_cuda_t g, const void *src, char *pack, void *full, int j0, int n,
                                   bool *queued) {
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    size_t rowb = (size_t)g->C * g->es, R = (size_t)g->R;
    *queued = true;
    mt_status_t st = o->all_gather(o->ctx, (const char *)src + (size_t)j0 * rowb, pack, (size_t)n * g->C, g->dt,
                                   g->tp_stream);
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->stream, g->tp_out, 0), "tp event wait");
    st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
    st = st != MT_OK ? st
                     : mt_cuda_status(cudaMemcpy2DAsync((char *)full + (size_t)j0 * rowb, R * rowb, pack,
                                                        (size_t)n * rowb, (size_t)n * rowb, (size_t)g->tp,
                                                        cudaMemcpyDeviceToDevice, g->stream),
                                      "gathered rows");
    return st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_OTHER);
}

/* Forward, a column-parallel region's entry: with sequence parallelism every rank's R rows of the LayerNorm output
 * (at g->lnloc) gathered into full (N, C), which backward keeps; then out (N, ldo) = full @ w^T + bias, OC columns
 * (gelu_pre: the fc layer's fused epilogue; OC = 0: the gather alone). With params.tp_chunks = k > 1 and sequence
 * parallelism the gather goes in k chunks on tp_stream (sp_gather_chunk, packed into g->tmp_c, free here), and
 * the compute stream, once chunk j is in its rows of full, computes their products (one per rank) while chunk
 * j + 1 is gathered. */
mt_status_t gpt2_cuda_colpar_forward(mt_gpt2_cuda_t g, void *full, void *out, int ldo, void *gelu_pre, const void *w,
                                     const void *bias, int OC) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (!g->sp || k <= 1) {
        MT_CHECK(gpt2_cuda_tp_gather(g, g->lnloc, full));
        if (OC > 0) {
            OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, out, ldo, gelu_pre, full, w, bias, N, C, OC, dt, s));
        }
        return MT_OK;
    }
    size_t es = g->es, rowb = (size_t)C * es, outb = (size_t)ldo * es;
    bool queued = false; /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event"); /* lnloc is written */
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(R, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = (char *)g->tmp_c + (size_t)tp * j0 * rowb;
        st = sp_gather_chunk(g, g->lnloc, pack, full, j0, n, &queued);
        for (int r = 0; r < tp && OC > 0 && st == MT_OK; r++) {
            size_t row = (size_t)r * R + j0;
            st = mt_cuda_status(mt_cuda_matmul_forward(g->ctx, (char *)out + row * outb, ldo,
                                                       gelu_pre ? (char *)gelu_pre + row * OC * es : NULL,
                                                       pack + (size_t)r * n * rowb, w, bias, n, C, OC, dt, s),
                                "column-parallel product");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_FWD);
        }
    }
    if (st != MT_OK && queued) {
        cudaStreamSynchronize(g->tp_stream);
    }
    return st;
}

/* Backward, a row-parallel region's product (inp (N, Cin) and w as rowpar_forward's): dinp (N, Cin) = dout @ w,
 * dw += dout^T inp and db += dout's column sums (whole on every tp rank), where dout (N,C) is the
 * gradient of the region's output, dresid: with sequence parallelism every rank's R rows of it gathered into
 * g->tmp_c (g backward). With params.tp_chunks = k > 1 the gather goes in k chunks on tp_stream (sp_gather_chunk,
 * packed into g->dfc, free here: its last reader is enqueued before), and the compute stream computes chunk j's
 * rows of dinp (one product per rank) while chunk j + 1 is gathered; dw and db then read the whole of tmp_c, as
 * unchunked. */
mt_status_t gpt2_cuda_rowpar_backward(mt_gpt2_cuda_t g, void *dinp, const void *inp, int Cin, const void *w, float *dw,
                                      float *db) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (!g->sp || k <= 1) {
        MT_CHECK(gpt2_cuda_tp_gather(g, g->dresid, g->tmp_c));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, dinp, dw, db, g->sp ? g->tmp_c : g->dresid, C, inp,
                                                        w, N, Cin, C, dt, g->col_scratch, s));
        return MT_OK;
    }
    size_t es = g->es, rowb = (size_t)C * es;
    MT_ASSERT(g->dfc_numel >= (size_t)N * C); /* every chunk's pack fits */
    bool queued = false; /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event"); /* dresid is complete */
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(R, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = (char *)g->dfc + (size_t)tp * j0 * rowb;
        st = sp_gather_chunk(g, g->dresid, pack, g->tmp_c, j0, n, &queued);
        for (int r = 0; r < tp && st == MT_OK; r++) {
            size_t row = (size_t)r * R + j0;
            st = mt_cuda_status(mt_cuda_matmul_backward_set(g->ctx, (char *)dinp + row * Cin * es, NULL, NULL,
                                                            pack + (size_t)r * n * rowb, C, NULL, w, n, Cin, C,
                                                            dt, NULL, s),
                                "row-parallel input gradient");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_BWD);
        }
    }
    if (st != MT_OK) {
        if (queued) {
            cudaStreamSynchronize(g->tp_stream);
        }
        return st;
    }
    OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, dw, db, g->tmp_c, C, inp, w, N, Cin, C, dt,
                                                    g->col_scratch, s));
    return MT_OK;
}
