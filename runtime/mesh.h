/* The device mesh: the world laid out as pp x dp x tp (more axes later) in a configurable order,
 * written fastest-varying first. The default "tp-dp-pp" means
 *     rank = tp_rank + tp * (dp_rank + dp * pp_rank)
 * so tensor-parallel groups are consecutive ranks. Pure arithmetic: no MPI, so any world can be
 * laid out on a laptop (`meshtrain topo --dry-run`). Communicators for groups are made by
 * collectives/ from the rank lists given here.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MESH_H
#define MT_MESH_H

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_AXIS_TP = 0, MT_AXIS_DP = 1, MT_AXIS_PP = 2, MT_AXIS_N = 3 } mt_axis_t;

#define MT_AXIS_BIT(a) (1u << (a))

typedef struct mt_mesh mt_mesh_t;

/* Lays out world_size ranks with the given axis sizes (dp = 0: world / (tp x pp)) in order, a
 * '-'-separated permutation of "tp", "dp", "pp", fastest first ("auto" is resolved by the topology
 * code before this call). Fails with MT_ERR_INVALID_ARG (and mt_error text) when the sizes do not
 * multiply to world_size or the order is not a permutation. */
mt_status_t mt_mesh_create(int world_size, int tp, int pp, int dp, const char *order, mt_mesh_t **out);
void mt_mesh_free(mt_mesh_t *mesh);

int mt_mesh_world(const mt_mesh_t *mesh);
int mt_mesh_axis_size(const mt_mesh_t *mesh, mt_axis_t axis);
/* The order as a string ("tp-dp-pp"). */
const char *mt_mesh_order(const mt_mesh_t *mesh);
const char *mt_axis_name(mt_axis_t axis);

/* Coordinates of rank along every axis. */
void mt_mesh_coords(const mt_mesh_t *mesh, int rank, int coords[MT_AXIS_N]);
int mt_mesh_rank_of(const mt_mesh_t *mesh, const int coords[MT_AXIS_N]);

/* The group of rank along the axes in axes_mask (MT_AXIS_BIT(MT_AXIS_TP) | ...): the ranks that differ
 * from rank only in those axes' coordinates, in increasing rank order, written to ranks (room for
 * mt_mesh_world entries). Returns the group size; *index_in_group (may be NULL) gets rank's index. */
int mt_mesh_group(const mt_mesh_t *mesh, int rank, unsigned axes_mask, int *ranks, int *index_in_group);

/* Previous / next pipeline stage of rank (same tp and dp coordinates), or -1 at the ends. */
int mt_mesh_pp_prev(const mt_mesh_t *mesh, int rank);
int mt_mesh_pp_next(const mt_mesh_t *mesh, int rank);

/* The embedding group of rank: the first and last pipeline stage with rank's tp/dp coordinates
 * (for tied embeddings). Writes 1 rank when pp = 1, else 2; returns the count. */
int mt_mesh_embedding_group(const mt_mesh_t *mesh, int rank, int ranks[2]);

/* Size of a group along axes_mask (the product of those axes' sizes; 1 for mask 0). */
int mt_mesh_group_size(const mt_mesh_t *mesh, unsigned axes_mask);

/* Parses a '-'-separated list of axis names ("tp", "tp-dp", "pp-dp-tp") into a mask; order (may be
 * NULL, room for MT_AXIS_N) gets the axes as written and *n_axes (may be NULL) their count. Fails with
 * MT_ERR_INVALID_ARG naming the unknown or repeated axis. */
mt_status_t mt_mesh_parse_axes(const char *s, unsigned *mask, int order[MT_AXIS_N], int *n_axes);

#ifdef __cplusplus
}
#endif
#endif /* MT_MESH_H */
