/* Process start-up and process-wide state: MPI, who this process is in the job (world rank, node,
 * local rank, cross-checked against the launcher's variables), and the abort path that ends the job.
 * SPDX-License-Identifier: MIT */
#ifndef MT_RT_H
#define MT_RT_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which launcher started the process, from its environment variables. */
typedef enum { MT_LAUNCHER_NONE = 0, MT_LAUNCHER_OPENMPI, MT_LAUNCHER_SLURM, MT_LAUNCHER_PMIX, MT_LAUNCHER_MPICH }
    mt_launcher_t;

typedef struct mt_world {
    int rank, size;             /* in MPI_COMM_WORLD */
    int local_rank, local_size; /* among the ranks of this node (MPI_COMM_TYPE_SHARED) */
    int node_id, n_nodes;       /* nodes numbered by the lowest world rank they hold */
    int thread_level;           /* what MPI_Init_thread granted */
    mt_launcher_t launcher;
    char hostname[256];
    MPI_Comm comm;       /* a duplicate of MPI_COMM_WORLD owned by the runtime */
    MPI_Comm local_comm; /* the ranks of this node */
} mt_world_t;

/* Initialises MPI (asking for MPI_THREAD_MULTIPLE, recording what was granted) unless the caller
 * already did, fills the world description and installs the MPI_Abort hook. A process started
 * outside any launcher is a 1-rank job. Idempotent. Fails with MT_ERR_MPI. */
mt_status_t mt_rt_init(int *argc, char ***argv);

/* The world of this process; valid after mt_rt_init (aborts if called before). */
const mt_world_t *mt_rt_world(void);

/* Whether mt_rt_init has run. */
bool mt_rt_initialized(void);

/* Frees runtime communicators and finalises MPI if mt_rt_init initialised it. */
mt_status_t mt_rt_finalize(void);

/* Ends the whole job with code on every rank (MPI_Abort when MPI is up, else exit). Never returns. */
_Noreturn void mt_rt_abort_job(int code);

/* Name of a launcher ("openmpi", "slurm", ...). */
const char *mt_launcher_name(mt_launcher_t l);

/* Reads the launcher's view of rank, local rank and node from the environment: -1 where it has
 * none. Pure function of the environment, exposed for tests. */
typedef struct {
    mt_launcher_t launcher;
    int rank, size, local_rank, local_size, node_id;
} mt_launcher_info_t;
void mt_launcher_detect(mt_launcher_info_t *out);

#ifdef __cplusplus
}
#endif
#endif /* MT_RT_H */
