/* The device mesh: pure index arithmetic that lays a world of ranks out as tp x dp x pp in a chosen
 * order (fastest-varying axis first) and answers coordinates, groups, pipeline neighbours and the
 * embedding group. No MPI here, so any world can be laid out and checked on a laptop.
 * SPDX-License-Identifier: MIT */
#include "mesh.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"

struct mt_mesh {
    int world;
    int size[MT_AXIS_N];   /* by axis */
    int stride[MT_AXIS_N]; /* by axis: rank distance between neighbours along it */
    int order[MT_AXIS_N];  /* axes by position, fastest first */
    char order_str[16];
};

static const char *const axis_names[MT_AXIS_N] = {"tp", "dp", "pp"};

const char *mt_axis_name(mt_axis_t axis) {
    return (axis >= 0 && axis < MT_AXIS_N) ? axis_names[axis] : "?";
}

static int axis_from_name(const char *s, size_t len) {
    for (int a = 0; a < MT_AXIS_N; a++) {
        if (strlen(axis_names[a]) == len && !strncmp(s, axis_names[a], len)) {
            return a;
        }
    }
    return -1;
}

mt_status_t mt_mesh_parse_axes(const char *s, unsigned *mask, int order[MT_AXIS_N], int *n_axes) {
    unsigned m = 0;
    int n = 0;
    if (!s || !*s) {
        return mt_error(MT_ERR_INVALID_ARG, "empty axis list: expected axes like \"tp\" or \"tp-dp\"");
    }
    const char *p = s;
    while (*p) {
        const char *dash = strchr(p, '-');
        size_t len = dash ? (size_t)(dash - p) : strlen(p);
        int a = axis_from_name(p, len);
        if (a < 0) {
            return mt_error(MT_ERR_INVALID_ARG, "unknown axis '%.*s' in \"%s\": axes are tp, dp and pp, joined by '-'",
                            (int)len, p, s);
        }
        if (m & MT_AXIS_BIT(a)) {
            return mt_error(MT_ERR_INVALID_ARG, "axis '%s' appears twice in \"%s\"", axis_names[a], s);
        }
        m |= MT_AXIS_BIT(a);
        if (order) {
            order[n] = a;
        }
        n++;
        if (!dash) {
            break;
        }
        p = dash + 1;
        if (!*p) {
            return mt_error(MT_ERR_INVALID_ARG, "axis list \"%s\" ends with '-'", s);
        }
    }
    *mask = m;
    if (n_axes) {
        *n_axes = n;
    }
    return MT_OK;
}

mt_status_t mt_mesh_create(int world_size, int tp, int pp, int dp, const char *order, mt_mesh_t **out) {
    *out = NULL;
    if (world_size < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "mesh: world size %d must be at least 1", world_size);
    }
    if (tp < 1 || pp < 1 || dp < 0) {
        return mt_error(MT_ERR_INVALID_ARG, "mesh: tp=%d pp=%d dp=%d: tp and pp must be >= 1, dp >= 0 (0 = derived)",
                        tp, pp, dp);
    }
    if (dp == 0) {
        if ((int64_t)tp * pp > world_size || world_size % (tp * pp) != 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "mesh: world size %d is not divisible by tp x pp = %d x %d: choose tp and pp whose "
                            "product divides the number of ranks",
                            world_size, tp, pp);
        }
        dp = world_size / (tp * pp);
    }
    if ((int64_t)tp * pp * dp != world_size) {
        return mt_error(MT_ERR_INVALID_ARG, "mesh: tp x dp x pp = %d x %d x %d = %lld, but the world has %d ranks", tp,
                        dp, pp, (long long)tp * pp * dp, world_size);
    }
    if (!order || !strcmp(order, "auto")) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "mesh: order \"%s\" must be resolved to a permutation of tp, dp, pp first "
                        "(mt_topo_auto_order does that for \"auto\")",
                        order ? order : "(null)");
    }
    unsigned mask = 0;
    int ord[MT_AXIS_N], n = 0;
    if (strlen(order) > 15) {
        return mt_error(MT_ERR_INVALID_ARG, "mesh: order \"%s\" is not a permutation of tp, dp, pp like \"tp-dp-pp\"",
                        order);
    }
    mt_status_t st = mt_mesh_parse_axes(order, &mask, ord, &n);
    if (st != MT_OK || n != MT_AXIS_N) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "mesh: order \"%s\" is not a permutation of tp, dp, pp (fastest-varying first, e.g. "
                        "\"tp-dp-pp\")%s%s",
                        order, st != MT_OK ? ": " : "", st != MT_OK ? mt_last_error_msg() : "");
    }
    mt_mesh_t *m = mt_calloc(sizeof(*m), MT_MEM_OTHER, "mesh");
    if (!m) {
        return mt_error(MT_ERR_OOM, "mesh: out of memory");
    }
    m->world = world_size;
    m->size[MT_AXIS_TP] = tp;
    m->size[MT_AXIS_DP] = dp;
    m->size[MT_AXIS_PP] = pp;
    int stride = 1;
    for (int i = 0; i < MT_AXIS_N; i++) {
        m->order[i] = ord[i];
        m->stride[ord[i]] = stride;
        stride *= m->size[ord[i]];
    }
    snprintf(m->order_str, sizeof(m->order_str), "%s-%s-%s", axis_names[ord[0]], axis_names[ord[1]],
             axis_names[ord[2]]);
    *out = m;
    return MT_OK;
}

void mt_mesh_free(mt_mesh_t *mesh) {
    mt_free(mesh);
}

int mt_mesh_world(const mt_mesh_t *mesh) {
    return mesh->world;
}

int mt_mesh_axis_size(const mt_mesh_t *mesh, mt_axis_t axis) {
    MT_ASSERT(axis >= 0 && axis < MT_AXIS_N);
    return mesh->size[axis];
}

const char *mt_mesh_order(const mt_mesh_t *mesh) {
    return mesh->order_str;
}

void mt_mesh_coords(const mt_mesh_t *mesh, int rank, int coords[MT_AXIS_N]) {
    MT_ASSERT(rank >= 0 && rank < mesh->world);
    for (int a = 0; a < MT_AXIS_N; a++) {
        coords[a] = (rank / mesh->stride[a]) % mesh->size[a];
    }
}

int mt_mesh_rank_of(const mt_mesh_t *mesh, const int coords[MT_AXIS_N]) {
    int r = 0;
    for (int a = 0; a < MT_AXIS_N; a++) {
        MT_ASSERT(coords[a] >= 0 && coords[a] < mesh->size[a]);
        r += coords[a] * mesh->stride[a];
    }
    return r;
}

int mt_mesh_group_size(const mt_mesh_t *mesh, unsigned axes_mask) {
    int n = 1;
    for (int a = 0; a < MT_AXIS_N; a++) {
        if (axes_mask & MT_AXIS_BIT(a)) {
            n *= mesh->size[a];
        }
    }
    return n;
}

/* The members are base + sum over masked axes of c_a * stride_a. Running an odometer over the masked
 * axes with the fastest-varying one turning first yields increasing ranks, because each axis' stride
 * is the product of the sizes (and so of the span) of every faster axis. */
int mt_mesh_group(const mt_mesh_t *mesh, int rank, unsigned axes_mask, int *ranks, int *index_in_group) {
    int c[MT_AXIS_N];
    mt_mesh_coords(mesh, rank, c);
    int axes[MT_AXIS_N], n_axes = 0, base = rank;
    for (int i = 0; i < MT_AXIS_N; i++) {
        int a = mesh->order[i];
        if (axes_mask & MT_AXIS_BIT(a)) {
            axes[n_axes++] = a;
            base -= c[a] * mesh->stride[a];
        }
    }
    int digit[MT_AXIS_N] = {0, 0, 0};
    int n = 0, idx = -1;
    for (;;) {
        int r = base;
        for (int i = 0; i < n_axes; i++) {
            r += digit[i] * mesh->stride[axes[i]];
        }
        if (r == rank) {
            idx = n;
        }
        ranks[n++] = r;
        int i = 0;
        while (i < n_axes && ++digit[i] == mesh->size[axes[i]]) {
            digit[i++] = 0;
        }
        if (i == n_axes) {
            break;
        }
    }
    if (index_in_group) {
        *index_in_group = idx;
    }
    return n;
}

static int pp_neighbour(const mt_mesh_t *mesh, int rank, int delta) {
    int c[MT_AXIS_N];
    mt_mesh_coords(mesh, rank, c);
    c[MT_AXIS_PP] += delta;
    if (c[MT_AXIS_PP] < 0 || c[MT_AXIS_PP] >= mesh->size[MT_AXIS_PP]) {
        return -1;
    }
    return mt_mesh_rank_of(mesh, c);
}

int mt_mesh_pp_prev(const mt_mesh_t *mesh, int rank) {
    return pp_neighbour(mesh, rank, -1);
}

int mt_mesh_pp_next(const mt_mesh_t *mesh, int rank) {
    return pp_neighbour(mesh, rank, +1);
}

int mt_mesh_embedding_group(const mt_mesh_t *mesh, int rank, int ranks[2]) {
    int c[MT_AXIS_N];
    mt_mesh_coords(mesh, rank, c);
    c[MT_AXIS_PP] = 0;
    ranks[0] = mt_mesh_rank_of(mesh, c);
    if (mesh->size[MT_AXIS_PP] == 1) {
        return 1;
    }
    c[MT_AXIS_PP] = mesh->size[MT_AXIS_PP] - 1;
    ranks[1] = mt_mesh_rank_of(mesh, c);
    return 2;
}
