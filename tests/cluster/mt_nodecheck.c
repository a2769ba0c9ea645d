/* Node-detection check for the cluster fixtures: every rank prints where it runs, then the job checks
 * that the runtime's rank/local rank/node agree with MPI, with the launcher's variables (Slurm or Open
 * MPI), with the expected shape (--nodes, --local-size), that hostnames are equal within a node and
 * distinct across nodes, and optionally the per-task GPU bookkeeping of Slurm (--gpus-per-task).
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt.h"
#include "testutil.h"

#define HOST_LEN 256 /* = sizeof(mt_world_t.hostname) */

/* Launcher variables are the inputs under test, not meshtrain knobs: plain getenv is intended. */
static int env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) {
        return -1;
    }
    char *end = NULL;
    long x = strtol(v, &end, 10);
    return (end && *end == '\0' && x >= 0) ? (int)x : -1;
}

/* Number of comma-separated entries in a list such as "0,2" ("" has none). */
static int list_len(const char *s) {
    if (!s || !*s) {
        return 0;
    }
    int n = 1;
    for (; *s; s++) {
        n += *s == ',';
    }
    return n;
}

/* Whether the comma-separated list `all` contains the entry `one`. */
static int list_has(const char *all, const char *one) {
    size_t n = strlen(one);
    for (const char *p = all; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && !strncmp(p, one, n)) {
            return 1;
        }
        p = c ? c + 1 : NULL;
    }
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: mt_nodecheck [--nodes N] [--local-size N] [--launcher slurm|openmpi] "
                    "[--gpus-per-task N]\n");
}

int main(int argc, char **argv) {
    int want_nodes = -1, want_local = -1, gpus_per_task = -1;
    const char *want_launcher = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--nodes")) {
            want_nodes = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--local-size")) {
            want_local = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--launcher")) {
            want_launcher = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--gpus-per-task")) {
            gpus_per_task = atoi(argv[++i]);
        } else {
            usage();
            return 2;
        }
    }
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    int r, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    const char *step_gpus = getenv("SLURM_STEP_GPUS");
    printf("nodecheck rank %d/%d local %d/%d node %d/%d host %s launcher %s cuda_visible %s step_gpus %s\n", w->rank,
           w->size, w->local_rank, w->local_size, w->node_id, w->n_nodes, w->hostname,
           mt_launcher_name(w->launcher), cvd ? cvd : "-", step_gpus ? step_gpus : "-");
    fflush(stdout);

    CHECK(w->rank == r && w->size == n, "rank %d/%d vs MPI %d/%d", w->rank, w->size, r, n);
    if (want_nodes >= 0) {
        CHECK(w->n_nodes == want_nodes, "rank %d sees %d nodes, expected %d", w->rank, w->n_nodes, want_nodes);
    }
    if (want_local >= 0) {
        CHECK(w->local_size == want_local, "rank %d has %d ranks on its node, expected %d", w->rank, w->local_size,
              want_local);
    }

    /* The launcher's own variables must be present and agree with MPI's view. */
    if (want_launcher && !strcmp(want_launcher, "slurm")) {
        int procid = env_int("SLURM_PROCID"), ntasks = env_int("SLURM_NTASKS");
        int localid = env_int("SLURM_LOCALID"), nodeid = env_int("SLURM_NODEID"), nnodes = env_int("SLURM_NNODES");
        CHECK(procid == w->rank, "SLURM_PROCID %d vs rank %d", procid, w->rank);
        CHECK(ntasks == w->size, "SLURM_NTASKS %d vs size %d", ntasks, w->size);
        CHECK(localid == w->local_rank, "rank %d: SLURM_LOCALID %d vs local rank %d", w->rank, localid, w->local_rank);
        CHECK(nodeid == w->node_id, "rank %d: SLURM_NODEID %d vs node %d", w->rank, nodeid, w->node_id);
        CHECK(nnodes == w->n_nodes, "SLURM_NNODES %d vs %d nodes", nnodes, w->n_nodes);
    } else if (want_launcher && !strcmp(want_launcher, "openmpi")) {
        int rank = env_int("OMPI_COMM_WORLD_RANK"), lrank = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
        int lsize = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
        CHECK(rank == w->rank, "OMPI_COMM_WORLD_RANK %d vs rank %d", rank, w->rank);
        CHECK(lrank == w->local_rank, "rank %d: OMPI_COMM_WORLD_LOCAL_RANK %d vs %d", w->rank, lrank, w->local_rank);
        CHECK(lsize == w->local_size, "rank %d: OMPI_COMM_WORLD_LOCAL_SIZE %d vs %d", w->rank, lsize, w->local_size);
    } else if (want_launcher) {
        CHECK(0, "unknown --launcher %s", want_launcher);
    }
    mt_launcher_info_t li;
    mt_launcher_detect(&li);
    if (want_launcher) {
        CHECK(li.launcher != MT_LAUNCHER_NONE, "rank %d: no launcher detected", w->rank);
        CHECK(li.rank == w->rank, "mt_launcher_detect rank %d vs %d", li.rank, w->rank);
    }

    /* Hostnames: the same on every rank of a node, different between nodes. */
    char host[HOST_LEN] = {0};
    snprintf(host, sizeof(host), "%s", w->hostname);
    char *hosts = calloc((size_t)w->size, HOST_LEN);
    int *nodes = calloc((size_t)w->size, sizeof(int));
    CHECK(hosts && nodes, "out of memory");
    if (hosts && nodes) {
        MPI_Allgather(host, HOST_LEN, MPI_CHAR, hosts, HOST_LEN, MPI_CHAR, w->comm);
        MPI_Allgather(&w->node_id, 1, MPI_INT, nodes, 1, MPI_INT, w->comm);
        for (int i = 0; i < w->size; i++) {
            int same_node = nodes[i] == w->node_id, same_host = !strcmp(hosts + (size_t)i * HOST_LEN, host);
            CHECK(same_node == same_host,
                  "ranks %d (node %d, %s) and %d (node %d, %s): node ids and hostnames disagree", w->rank, w->node_id,
                  host, i, nodes[i], hosts + (size_t)i * HOST_LEN);
        }
    }
    free(hosts);
    free(nodes);

    /* Slurm GPU bookkeeping: each task sees exactly its own GPUs (CUDA_VISIBLE_DEVICES, and Slurm's
     * SLURM_STEP_GPUS, which Slurm sets per task when it binds GPUs to tasks), disjoint from the GPUs
     * of the other tasks of its node. */
    if (gpus_per_task >= 0) {
        CHECK(cvd != NULL, "rank %d: CUDA_VISIBLE_DEVICES is not set", w->rank);
        CHECK(step_gpus != NULL, "rank %d: SLURM_STEP_GPUS is not set", w->rank);
        char mine[HOST_LEN] = {0};
        if (cvd && step_gpus) {
            CHECK(list_len(cvd) == gpus_per_task, "rank %d: CUDA_VISIBLE_DEVICES=%s, expected %d GPUs", w->rank, cvd,
                  gpus_per_task);
            CHECK(list_len(step_gpus) == gpus_per_task, "rank %d: SLURM_STEP_GPUS=%s, expected %d GPUs", w->rank,
                  step_gpus, gpus_per_task);
            snprintf(mine, sizeof(mine), "%s", cvd);
        }
        char *all = calloc((size_t)w->local_size, HOST_LEN);
        CHECK(all != NULL, "out of memory");
        if (all) {
            MPI_Allgather(mine, HOST_LEN, MPI_CHAR, all, HOST_LEN, MPI_CHAR, w->local_comm);
            for (int i = 0; i < w->local_size; i++) {
                char *dup = i == w->local_rank ? NULL : strdup(all + (size_t)i * HOST_LEN);
                for (char *tok = dup ? strtok(dup, ",") : NULL; tok; tok = strtok(NULL, ",")) {
                    CHECK(!list_has(mine, tok), "local ranks %d (%s) and %d (%s) share GPU %s", w->local_rank, mine, i,
                          all + (size_t)i * HOST_LEN, tok);
                }
                free(dup);
            }
            free(all);
        }
    }
    return mt_test_finish_mpi("mt_nodecheck"); /* also finalises MPI */
}
