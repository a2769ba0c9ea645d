/* Start-up: MPI_Init_thread, rank/node/local-rank discovery through MPI_Comm_split_type, a
 * cross-check against Open MPI / Slurm / PMIx variables, and the MPI_Abort hook.
 * SPDX-License-Identifier: MIT */
#include "rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static mt_world_t world;
static bool rt_initialized;
static bool rt_owns_mpi;

const char *mt_launcher_name(mt_launcher_t l) {
    switch (l) {
    case MT_LAUNCHER_OPENMPI: return "openmpi";
    case MT_LAUNCHER_SLURM: return "slurm";
    case MT_LAUNCHER_PMIX: return "pmix";
    case MT_LAUNCHER_MPICH: return "mpich";
    default: return "none";
    }
}

static int env_int(const char *name) {
    const char *v = getenv(name); /* launcher variables are inputs, not meshtrain knobs */
    if (!v || !*v) {
        return -1;
    }
    char *end = NULL;
    long x = strtol(v, &end, 10);
    return (end && *end == '\0' && x >= 0) ? (int)x : -1;
}

void mt_launcher_detect(mt_launcher_info_t *out) {
    memset(out, 0, sizeof(*out));
    out->rank = out->size = out->local_rank = out->local_size = out->node_id = -1;
    if (env_int("OMPI_COMM_WORLD_RANK") >= 0) {
        out->launcher = MT_LAUNCHER_OPENMPI;
        out->rank = env_int("OMPI_COMM_WORLD_RANK");
        out->size = env_int("OMPI_COMM_WORLD_SIZE");
        out->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
        out->local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
        /* Under srun with PMIx, Slurm variables are also set and know the node. */
        if (env_int("SLURM_PROCID") >= 0 && env_int("SLURM_STEP_ID") >= 0) {
            out->node_id = env_int("SLURM_NODEID");
        }
    } else if (env_int("SLURM_PROCID") >= 0 && env_int("SLURM_STEP_ID") >= 0) {
        out->launcher = MT_LAUNCHER_SLURM;
        out->rank = env_int("SLURM_PROCID");
        out->size = env_int("SLURM_NTASKS");
        out->local_rank = env_int("SLURM_LOCALID");
        out->node_id = env_int("SLURM_NODEID");
    } else if (env_int("PMIX_RANK") >= 0) {
        out->launcher = MT_LAUNCHER_PMIX;
        out->rank = env_int("PMIX_RANK");
    } else if (env_int("PMI_RANK") >= 0) {
        out->launcher = MT_LAUNCHER_MPICH;
        out->rank = env_int("PMI_RANK");
        out->size = env_int("PMI_SIZE");
        out->local_rank = env_int("MPI_LOCALRANKID");
        out->local_size = env_int("MPI_LOCALNRANKS");
    }
}

static void rt_abort_hook(int code, void *arg) {
    (void)arg;
    mt_rt_abort_job(code);
}

_Noreturn void mt_rt_abort_job(int code) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    fflush(stdout);
    fflush(stderr);
    if (up && !down) {
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    _exit(code);
}

mt_status_t mt_rt_init(int *argc, char ***argv) {
    if (rt_initialized) {
        return MT_OK;
    }
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {
        int provided = MPI_THREAD_SINGLE;
        MT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
        rt_owns_mpi = true;
        world.thread_level = provided;
    } else {
        MT_MPI_CHECK(MPI_Query_thread(&world.thread_level));
    }
    /* Errors come back as codes so they become statuses with MPI's own message. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world.comm));
    MT_MPI_CHECK(MPI_Comm_rank(world.comm, &world.rank));
    MT_MPI_CHECK(MPI_Comm_size(world.comm, &world.size));
    mt_log_set_rank(world.rank);
    mt_set_abort_hook(rt_abort_hook, NULL);

    MT_MPI_CHECK(MPI_Comm_split_type(world.comm, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &world.local_comm));
    MT_MPI_CHECK(MPI_Comm_rank(world.local_comm, &world.local_rank));
    MT_MPI_CHECK(MPI_Comm_size(world.local_comm, &world.local_size));

    /* Node index: the leaders (local rank 0) ranked among themselves by world rank. */
    MPI_Comm leaders;
    MT_MPI_CHECK(MPI_Comm_split(world.comm, world.local_rank == 0 ? 0 : MPI_UNDEFINED, world.rank, &leaders));
    int node = 0;
    if (leaders != MPI_COMM_NULL) {
        MT_MPI_CHECK(MPI_Comm_rank(leaders, &node));
        MPI_Comm_free(&leaders);
    }
    MT_MPI_CHECK(MPI_Bcast(&node, 1, MPI_INT, 0, world.local_comm));
    world.node_id = node;
    int is_leader = world.local_rank == 0;
    MT_MPI_CHECK(MPI_Allreduce(&is_leader, &world.n_nodes, 1, MPI_INT, MPI_SUM, world.comm));
    gethostname(world.hostname, sizeof(world.hostname) - 1);

    /* Cross-check with the launcher: a mismatch means a mis-launch (e.g. mpirun inside srun). */
    mt_launcher_info_t li;
    mt_launcher_detect(&li);
    world.launcher = li.launcher;
    if (li.rank >= 0 && li.rank != world.rank) {
        MT_WARN("launcher %s says rank %d but MPI says %d: is the job started by two launchers?",
                mt_launcher_name(li.launcher), li.rank, world.rank);
    }
    if (li.size >= 0 && li.size != world.size) {
        MT_WARN("launcher %s says %d ranks but MPI says %d", mt_launcher_name(li.launcher), li.size, world.size);
    }
    if (li.local_rank >= 0 && li.local_rank != world.local_rank) {
        MT_WARN("launcher %s says local rank %d but MPI's shared-memory split says %d",
                mt_launcher_name(li.launcher), li.local_rank, world.local_rank);
    }
    if (world.thread_level < MPI_THREAD_MULTIPLE) {
        MT_INFO(MT_LOG_INIT, "MPI granted thread level %d (< MPI_THREAD_MULTIPLE)", world.thread_level);
    }
    MT_INFO(MT_LOG_INIT, "rank %d/%d on %s: node %d/%d, local rank %d/%d, launcher %s", world.rank, world.size,
            world.hostname, world.node_id, world.n_nodes, world.local_rank, world.local_size,
            mt_launcher_name(world.launcher));
    rt_initialized = true;
    return MT_OK;
}

bool mt_rt_initialized(void) { return rt_initialized; }

const mt_world_t *mt_rt_world(void) {
    MT_ASSERT(rt_initialized);
    return &world;
}

mt_status_t mt_rt_finalize(void) {
    if (!rt_initialized) {
        return MT_OK;
    }
    MPI_Comm_free(&world.local_comm);
    MPI_Comm_free(&world.comm);
    rt_initialized = false;
    if (rt_owns_mpi) {
        MT_MPI_CHECK(MPI_Finalize());
    }
    return MT_OK;
}
