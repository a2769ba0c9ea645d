/* Group communicators on the device mesh: this rank's group along a set of mesh axes, made from the
 * rank list runtime/mesh.h computes. In its own file so programs that never use a mesh do not need
 * the mesh code linked in.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "runtime/alloc.h"
#include "runtime/mesh.h"

mt_status_t mt_comm_init_mesh(MPI_Comm world, const struct mt_mesh *mesh, unsigned axes_mask,
                              const mt_comm_params_t *params, mt_comm_t *out) {
    if (!mesh || !out || axes_mask == 0 || axes_mask >= (1u << MT_AXIS_N)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_comm_init_mesh: need a mesh, out and a non-empty mask of axes "
                        "(MT_AXIS_BIT(MT_AXIS_TP) | ...), got mask 0x%x",
                        axes_mask);
    }
    int me, wsize;
    MPI_Comm_rank(world, &me);
    MPI_Comm_size(world, &wsize);
    if (wsize != mt_mesh_world(mesh)) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_comm_init_mesh: the mesh lays out %d ranks but the communicator has %d",
                        mt_mesh_world(mesh), wsize);
    }
    int *ranks = mt_alloc(sizeof(int) * (size_t)wsize, MT_MEM_OTHER, "mt_comm_init_mesh");
    if (!ranks) {
        return mt_error(MT_ERR_OOM, "mt_comm_init_mesh: out of memory");
    }
    int n = mt_mesh_group(mesh, me, axes_mask, ranks, NULL);
    char name[64] = "";
    for (int a = 0; a < MT_AXIS_N; a++) {
        if (axes_mask & MT_AXIS_BIT(a)) {
            size_t l = strlen(name);
            snprintf(name + l, sizeof(name) - l, "%s%s", l ? "-" : "", mt_axis_name((mt_axis_t)a));
        }
    }
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    if (params) {
        if (params->size < sizeof(size_t) || params->size > sizeof(p)) {
            mt_free(ranks);
            return mt_error(MT_ERR_INVALID_ARG, "mt_comm_params_t.size = %zu: use MT_COMM_PARAMS_INIT", params->size);
        }
        memcpy(&p, params, params->size);
    }
    if (!p.name) {
        p.name = name;
    }
    mt_status_t st = mt_comm_init_ranks(world, ranks, n, &p, out);
    mt_free(ranks);
    return st;
}
