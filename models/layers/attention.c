/* Causal multi-head self-attention on strided views of qkv (B,T,3C), in blocked tiles: per (b, h) the head's keys
 * and values are packed once (K^T and V^T as hs x Tp, K and V as T x hsp rows, zero-padded), then the queries go
 * four rows at a time. The tile's scores are a register-blocked product (4 rows x 2 vectors of keys, summed over
 * the head dimension), only the keys up to the tile's last row are touched (the causal half above the diagonal is
 * skipped), and P V, dQ = dS K, dK += dS^T Q and dV += P^T dO are register-blocked over the head dimension. No
 * T x T matrix is needed: the scores of one tile (4 x T) live in per-thread scratch. Two variants: keep the
 * probabilities att (B,NH,T,T) for backward, or keep only the per-row log-sum-exp lse (B,NH,T) and recompute the
 * tile's scores in backward.
 *
 * Every sum runs in a fixed order whatever the vector width (a score over the head dimension in index order, an
 * output over the keys in position order, a row's softmax sum in 16 lanes in both builds), so the baseline build gives
 * the same bits on any x86-64; the AVX-512 build contracts the products into fused multiply-adds, which moves the last
 * bits (tests/models/test_layers_isa.c holds the two builds to each other). OpenMP over (b, h).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "kernel_isa.h"
#include "layers.h"

#ifdef MT_KERNEL_AVX512
#include <immintrin.h>
#define VL 16
typedef float vf __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
static inline vf vfma(vf a, vf b, vf c) {
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
#else
#define VL 4
typedef float vf __attribute__((vector_size(16)));
typedef float vfu __attribute__((vector_size(16), aligned(4)));
static inline vf vfma(vf a, vf b, vf c) {
    return a * b + c;
}
#endif

#define QT 4    /* query rows per tile */
#define KPAD 32 /* keys padded to a multiple of this (2 vectors of the widest build) */
#define DPAD 16 /* head dimension of the row-packed buffers padded to this (one vector of the widest build) */

MT_KPROTO(void, mt_attention_forward_impl,
          (float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH, float *scratch));
MT_KPROTO(void, mt_attention_backward_impl,
          (float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse, int B, int T, int C,
           int NH, float *scratch));

static inline size_t up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

/* One thread's scratch, carved in 64-byte multiples: K^T and V^T (hs x Tp), K, V (forward) and the dK, dV
 * accumulators (T x hsp each; V at least QT rows: backward's dQ tile goes there), the tile's scores / probabilities and
 * dP / dS (QT x Tp), its packed query and output-gradient rows (QT x hsp). Both builds carve the same layout, so one
 * size serves either. */
typedef struct {
    float *kt, *vt, *kr, *vr, *dk, *dv, *s, *dp, *qp, *op;
} attn_ws_t;

static size_t attn_ws(float *base, int T, int hs, attn_ws_t *w) {
    size_t Tp = up((size_t)T, KPAD), hsp = up((size_t)hs, DPAD), at = 0;
    size_t sizes[10] = {(size_t)hs * Tp, (size_t)hs * Tp, (size_t)T * hsp, (size_t)(T > QT ? T : QT) * hsp,
                        (size_t)T * hsp, (size_t)T * hsp, QT * Tp,         QT * Tp,
                        QT * hsp,        QT * hsp};
    float **slot[10] = {&w->kt, &w->vt, &w->kr, &w->vr, &w->dk, &w->dv, &w->s, &w->dp, &w->qp, &w->op};
    for (int i = 0; i < 10; i++) {
        if (base) {
            *slot[i] = base + at;
        }
        at += up(sizes[i], 16);
    }
    return at;
}

#ifdef MT_KERNEL_DISPATCH
size_t mt_attention_scratch_floats(int T, int hs) {
    int nt = omp_get_max_threads();
    return attn_ws(NULL, T, hs, &(attn_ws_t){0}) * (size_t)(nt > 1 ? nt : 1) + 16; /* + 16: alignment */
}
#endif

/* Thread tid's workspace in scratch, 64-byte aligned. */
static float *attn_thread_ws(float *scratch, int T, int hs, attn_ws_t *w) {
    size_t per = attn_ws(NULL, T, hs, w);
    uintptr_t p = (uintptr_t)scratch;
    float *base = (float *)((p + 63) & ~(uintptr_t)63) + per * (size_t)omp_get_thread_num();
    attn_ws(base, T, hs, w);
    return base;
}

static inline vf vload(const float *p) {
    return *(const vfu *)p;
}
static inline void vstore(float *p, vf v) {
    *(vfu *)p = v;
}
static inline vf vbcast(float x) {
    vf v = {0};
    return v + x;
}

/* Row softmax over s <= t of a scores row with room for up(t + 1, 16) entries: the maximum, then exp(S - max) in
 * place, summed in 16 lanes (lane s % 16, each in position order, then the lanes in order: the same bits in either
 * build); the entries past t become 0. Returns the sum; *mx the maximum. */
static float row_softmax_exp(float *row, int t, float *mx) {
    int n16 = (int)up((size_t)t + 1, 16);
    for (int s = t + 1; s < n16; s++) {
        row[s] = -INFINITY;
    }
    float m[16];
    for (int j = 0; j < 16; j++) {
        m[j] = row[j];
    }
    for (int s0 = 16; s0 < n16; s0 += 16) {
        for (int j = 0; j < 16; j++) {
            m[j] = row[s0 + j] > m[j] ? row[s0 + j] : m[j];
        }
    }
    float x = m[0];
    for (int j = 1; j < 16; j++) {
        x = m[j] > x ? m[j] : x;
    }
    float acc[16] = {0};
    for (int s0 = 0; s0 < n16; s0 += 16) {
        for (int j = 0; j < 16; j++) {
            float e = mt_fast_expf(row[s0 + j] - x);
            row[s0 + j] = e;
            acc[j] += e;
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < 16; j++) {
        sum += acc[j];
    }
    *mx = x;
    return sum;
}

/* sum_{s < n} a[s] b[s] in 16 lanes as row_softmax_exp sums (a and b readable and zero past n up to a multiple
 * of 16). */
static float dot16(const float *a, const float *b, int n) {
    float acc[16] = {0};
    for (int s0 = 0; s0 < n; s0 += 16) {
        for (int j = 0; j < 16; j++) {
            acc[j] += a[s0 + j] * b[s0 + j];
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < 16; j++) {
        sum += acc[j];
    }
    return sum;
}

/* S[i][s] = scale * sum_d A[i][d] Bt[d][s] for the QT rows of A (stride hsp) and keys s < nk rounded up to 2 VL
 * (Bt: hs x Tp, zero past the last key). Each score sums over d in index order. */
static void tile_scores(float *S, size_t Tp, const float *A, size_t hsp, const float *Bt, int hs, int nk, float scale) {
    for (int s0 = 0; s0 < nk; s0 += 2 * VL) {
        vf a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
        const float *bt = Bt + s0;
        for (int d = 0; d < hs; d++, bt += Tp) {
            vf k0 = vload(bt), k1 = vload(bt + VL);
            vf q0 = vbcast(A[d]), q1 = vbcast(A[hsp + d]), q2 = vbcast(A[2 * hsp + d]), q3 = vbcast(A[3 * hsp + d]);
            a00 = vfma(q0, k0, a00);
            a01 = vfma(q0, k1, a01);
            a10 = vfma(q1, k0, a10);
            a11 = vfma(q1, k1, a11);
            a20 = vfma(q2, k0, a20);
            a21 = vfma(q2, k1, a21);
            a30 = vfma(q3, k0, a30);
            a31 = vfma(q3, k1, a31);
        }
        vstore(S + s0, a00 * scale);
        vstore(S + s0 + VL, a01 * scale);
        vstore(S + Tp + s0, a10 * scale);
        vstore(S + Tp + s0 + VL, a11 * scale);
        vstore(S + 2 * Tp + s0, a20 * scale);
        vstore(S + 2 * Tp + s0 + VL, a21 * scale);
        vstore(S + 3 * Tp + s0, a30 * scale);
        vstore(S + 3 * Tp + s0 + VL, a31 * scale);
    }
}

/* O[i][c0 .. c0 + NV VL) = sum_{s < n} W[i][s] R[s][c0 ..] over the QT rows of W (stride Tp) and rows of R
 * (stride hsp), summed over s in order. */
#define TILE_ROWS_BODY(NV)                                                                                             \
    do {                                                                                                               \
        vf acc[QT][NV];                                                                                                \
        for (int i = 0; i < QT; i++) {                                                                                 \
            for (int v = 0; v < (NV); v++) {                                                                           \
                acc[i][v] = (vf){0};                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
        const float *r = R + c0;                                                                                       \
        for (int s = 0; s < n; s++, r += hsp) {                                                                        \
            vf x[NV];                                                                                                  \
            for (int v = 0; v < (NV); v++) {                                                                           \
                x[v] = vload(r + v * VL);                                                                              \
            }                                                                                                          \
            for (int i = 0; i < QT; i++) {                                                                             \
                vf wv = vbcast(W[i * Tp + s]);                                                                         \
                for (int v = 0; v < (NV); v++) {                                                                       \
                    acc[i][v] = vfma(wv, x[v], acc[i][v]);                                                             \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (int i = 0; i < QT; i++) {                                                                                 \
            for (int v = 0; v < (NV); v++) {                                                                           \
                vstore(O + i * hsp + c0 + v * VL, acc[i][v]);                                                          \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static void tile_rows(float *O, const float *W, size_t Tp, const float *R, size_t hsp, int n) {
    size_t c0 = 0;
    for (; c0 + 4 * VL <= hsp; c0 += 4 * VL) {
        TILE_ROWS_BODY(4);
    }
    for (; c0 < hsp; c0 += VL) {
        TILE_ROWS_BODY(1);
    }
}

/* D[s][c0 .. c0 + NV VL) += sum_i W[i][s] X[i][c0 ..] for s < n, over the QT rows of X (stride hsp) in order
 * i = 0, 1, .. (the X chunk and each key's four weights held in registers). */
#define TILE_ACCUM_BODY(NV)                                                                                            \
    do {                                                                                                               \
        vf x[QT][NV];                                                                                                  \
        for (int i = 0; i < QT; i++) {                                                                                 \
            for (int v = 0; v < (NV); v++) {                                                                           \
                x[i][v] = vload(X + i * hsp + c0 + v * VL);                                                            \
            }                                                                                                          \
        }                                                                                                              \
        float *d = D + c0;                                                                                             \
        for (int s = 0; s < n; s++, d += hsp) {                                                                        \
            vf w0 = vbcast(W[s]), w1 = vbcast(W[Tp + s]), w2 = vbcast(W[2 * Tp + s]), w3 = vbcast(W[3 * Tp + s]);      \
            for (int v = 0; v < (NV); v++) {                                                                           \
                vf a = vload(d + v * VL);                                                                              \
                a = vfma(w0, x[0][v], a);                                                                              \
                a = vfma(w1, x[1][v], a);                                                                              \
                a = vfma(w2, x[2][v], a);                                                                              \
                a = vfma(w3, x[3][v], a);                                                                              \
                vstore(d + v * VL, a);                                                                                 \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static void tile_accum(float *D, size_t hsp, const float *W, size_t Tp, const float *X, int n) {
    size_t c0 = 0;
    for (; c0 + 4 * VL <= hsp; c0 += 4 * VL) {
        TILE_ACCUM_BODY(4);
    }
    for (; c0 < hsp; c0 += VL) {
        TILE_ACCUM_BODY(1);
    }
}

/* Head h of sequence b: K^T or V^T (which = 1, 2) into hs x Tp, zero past T. */
static void pack_t(float *dst, size_t Tp, const float *qkv, int T, int C, int hs, int which) {
    for (int s = 0; s < T; s++) {
        const float *src = qkv + (size_t)s * 3 * C + which * C;
        for (int d = 0; d < hs; d++) {
            dst[(size_t)d * Tp + s] = src[d];
        }
    }
    for (int d = 0; d < hs; d++) {
        memset(dst + (size_t)d * Tp + T, 0, (Tp - (size_t)T) * sizeof(float));
    }
}

/* n rows of hs floats at src (stride ld) into rows of hsp at dst, zero-padded; rows n .. nrows zero. */
static void pack_rows(float *dst, size_t hsp, const float *src, size_t ld, int n, int nrows, int hs) {
    for (int i = 0; i < nrows; i++) {
        if (i < n) {
            memcpy(dst + (size_t)i * hsp, src + (size_t)i * ld, (size_t)hs * sizeof(float));
            memset(dst + (size_t)i * hsp + hs, 0, (hsp - (size_t)hs) * sizeof(float));
        } else {
            memset(dst + (size_t)i * hsp, 0, hsp * sizeof(float));
        }
    }
}

/* Per (b, h, t): S_s = scale q_t.k_s for s <= t; P = softmax(S); out_t = sum_s P_s v_s. */
void MT_KNAME(mt_attention_forward_impl)(float *out, float *att, float *lse, const float *qkv, int B, int T, int C,
                                         int NH, float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    size_t Tp = up((size_t)T, KPAD), hsp = up((size_t)hs, DPAD);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            attn_ws_t w;
            attn_thread_ws(scratch, T, hs, &w);
            const float *base = qkv + (size_t)b * T * C3 + h * hs;
            pack_t(w.kt, Tp, base, T, C, hs, 1);
            pack_rows(w.vr, hsp, base + 2 * C, C3, T, T, hs);
            for (int t0 = 0; t0 < T; t0 += QT) {
                int r = T - t0 < QT ? T - t0 : QT, nk = t0 + r;
                pack_rows(w.qp, hsp, base + (size_t)t0 * C3, C3, r, QT, hs);
                tile_scores(w.s, Tp, w.qp, hsp, w.kt, hs, nk, scale);
                for (int i = 0; i < QT; i++) {
                    float *row = w.s + i * Tp;
                    int t = t0 + i;
                    if (i >= r) {
                        memset(row, 0, (size_t)nk * sizeof(float));
                        continue;
                    }
                    float mx, sum = row_softmax_exp(row, t, &mx), inv = 1.0f / sum;
                    for (int s = 0; s <= t; s++) {
                        row[s] *= inv;
                    }
                    for (int s = t + 1; s < nk; s++) {
                        row[s] = 0.0f;
                    }
                    if (lse) {
                        lse[((size_t)b * NH + h) * T + t] = mx + logf(sum);
                    }
                    if (att) {
                        float *a = att + (((size_t)b * NH + h) * T + t) * T;
                        memcpy(a, row, (size_t)(t + 1) * sizeof(float));
                        memset(a + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
                    }
                }
                tile_rows(w.op, w.s, Tp, w.vr, hsp, nk);
                for (int i = 0; i < r; i++) {
                    memcpy(out + ((size_t)b * T + t0 + i) * C + h * hs, w.op + i * hsp, (size_t)hs * sizeof(float));
                }
            }
        }
    }
}

/* With P the probabilities and dO the output gradient of one head, per row t:
 *   dV_s += P_s dO_t;  dP_s = dO_t.v_s;  dS_s = P_s (dP_s - sum_s' P_s' dP_s');
 *   dQ_t += scale sum_s dS_s k_s;  dK_s += scale dS_s q_t.
 * dK and dV of a position collect from many rows, so threads split (b, h) only; each head's dK and dV are summed
 * over the rows in order in scratch and then added to dqkv. */
void MT_KNAME(mt_attention_backward_impl)(float *dqkv, const float *dout, const float *qkv, const float *att,
                                          const float *lse, int B, int T, int C, int NH, float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    size_t Tp = up((size_t)T, KPAD), hsp = up((size_t)hs, DPAD);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            attn_ws_t w;
            attn_thread_ws(scratch, T, hs, &w);
            const float *base = qkv + (size_t)b * T * C3 + h * hs;
            const float *dbase = dout + (size_t)b * T * C + h * hs;
            float *gbase = dqkv + (size_t)b * T * C3 + h * hs;
            if (!att) {
                pack_t(w.kt, Tp, base, T, C, hs, 1);
            }
            pack_t(w.vt, Tp, base, T, C, hs, 2);
            pack_rows(w.kr, hsp, base + C, C3, T, T, hs);
            memset(w.dk, 0, (size_t)T * hsp * sizeof(float));
            memset(w.dv, 0, (size_t)T * hsp * sizeof(float));
            for (int t0 = 0; t0 < T; t0 += QT) {
                int r = T - t0 < QT ? T - t0 : QT, nk = t0 + r;
                pack_rows(w.qp, hsp, base + (size_t)t0 * C3, C3, r, QT, hs);
                pack_rows(w.op, hsp, dbase + (size_t)t0 * C, C, r, QT, hs);
                if (!att) {
                    tile_scores(w.s, Tp, w.qp, hsp, w.kt, hs, nk, scale);
                }
                tile_scores(w.dp, Tp, w.op, hsp, w.vt, hs, nk, 1.0f);
                for (int i = 0; i < QT; i++) {
                    float *p = w.s + i * Tp, *dp = w.dp + i * Tp;
                    int t = t0 + i;
                    if (i >= r) {
                        memset(p, 0, (size_t)nk * sizeof(float));
                        memset(dp, 0, (size_t)nk * sizeof(float));
                        continue;
                    }
                    size_t row = ((size_t)b * NH + h) * T + t;
                    if (att) {
                        memcpy(p, att + row * T, (size_t)(t + 1) * sizeof(float));
                    } else {
                        float l = lse[row];
#pragma omp simd
                        for (int s = 0; s <= t; s++) {
                            p[s] = mt_fast_expf(p[s] - l);
                        }
                    }
                    int n16 = (int)up((size_t)t + 1, 16);
                    for (int s = t + 1; s < n16; s++) {
                        p[s] = 0.0f;
                        dp[s] = 0.0f;
                    }
                    float pdp = dot16(p, dp, t + 1);
                    for (int s = 0; s <= t; s++) {
                        dp[s] = scale * p[s] * (dp[s] - pdp);
                    }
                    for (int s = n16; s < nk; s++) {
                        p[s] = 0.0f;
                        dp[s] = 0.0f;
                    }
                }
                tile_rows(w.vr, w.dp, Tp, w.kr, hsp, nk); /* dQ of the tile's rows, into vr's first rows */
                for (int i = 0; i < r; i++) {
                    float *g = gbase + (size_t)(t0 + i) * C3;
                    const float *dq = w.vr + i * hsp;
                    for (int d = 0; d < hs; d++) {
                        g[d] += dq[d];
                    }
                }
                tile_accum(w.dk, hsp, w.dp, Tp, w.qp, nk);
                tile_accum(w.dv, hsp, w.s, Tp, w.op, nk);
            }
            for (int s = 0; s < T; s++) {
                float *g = gbase + (size_t)s * C3;
                const float *dk = w.dk + (size_t)s * hsp, *dv = w.dv + (size_t)s * hsp;
                for (int d = 0; d < hs; d++) {
                    g[C + d] += dk[d];
                    g[2 * C + d] += dv[d];
                }
            }
        }
    }
}

#ifdef MT_KERNEL_DISPATCH
void mt_attention_forward(float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH,
                          float *scratch) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_attention_forward_impl, (out, att, lse, qkv, B, T, C, NH, scratch));
    mt_layers_prof_end(MT_OP_ATTENTION_FWD, t0);
}

void mt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse, int B,
                           int T, int C, int NH, float *scratch) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_attention_backward_impl, (dqkv, dout, qkv, att, lse, B, T, C, NH, scratch));
    mt_layers_prof_end(MT_OP_ATTENTION_BWD, t0);
}
#endif
