/* `meshtrain export --llmc OUT.bin [CONFIG.toml] [--section.key=value ...]`: builds the GPT-2 model the
 * configuration describes (random initialisation from train.seed, or model.init = "llmc:PATH") and writes
 * its weights as an llm.c checkpoint, so weights move between the two projects. With a CHECKPOINT
 * argument (a meshtrain checkpoint of any layout, or its checkpoint.dir) the weights come from there
 * instead. Rank 0 writes.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "train/job.h"
#include "models/llmc.h"
#include "models/model_config.h"
#include "runtime/config.h"
#include "runtime/rt.h"

static void usage(FILE *out) {
    fprintf(out, "usage: meshtrain export --llmc OUT.bin [CONFIG.toml] [--section.key=value ...]\n"
                 "       meshtrain export --llmc OUT.bin CHECKPOINT\n"
                 "Writes the GPT-2 weights the configuration describes (model.init = \"random\" from train.seed,\n"
                 "or \"llmc:PATH\") as an llm.c fp32 checkpoint (llm.c's train_gpt2 reads it). CHECKPOINT (a\n"
                 "meshtrain checkpoint directory written under any layout, or a checkpoint.dir: its latest) takes\n"
                 "the weights from a training checkpoint instead.\n");
}

int mt_cmd_export(int argc, char **argv) {
    int rank = mt_rt_world()->rank;
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (rank == 0) {
            fprintf(stderr, "meshtrain export: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    const char *out = NULL, *ckpt = NULL;
    for (int i = 1; i < cli.rest_argc; i++) {
        const char *a = cli.rest_argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (rank == 0) {
                usage(stdout);
            }
            mt_config_cli_free(&cli);
            return 0;
        } else if (!strcmp(a, "--llmc") && i + 1 < cli.rest_argc) {
            out = cli.rest_argv[++i];
        } else if (!strncmp(a, "--llmc=", 7)) {
            out = a + 7;
        } else if (a[0] != '-' && !ckpt) {
            ckpt = a;
        } else {
            if (rank == 0) {
                fprintf(stderr, "meshtrain export: unexpected argument '%s'\n", a);
                usage(stderr);
            }
            mt_config_cli_free(&cli);
            return 2;
        }
    }
    if (!out) {
        if (rank == 0) {
            fprintf(stderr, "meshtrain export: missing --llmc OUT.bin\n");
            usage(stderr);
        }
        mt_config_cli_free(&cli);
        return 2;
    }
    if (ckpt) {
        if (cli.path || cli.n_overrides > 0) {
            if (rank == 0) {
                fprintf(stderr, "meshtrain export: CHECKPOINT carries its own configuration; drop the config file "
                                "and --section.key overrides\n");
            }
            mt_config_cli_free(&cli);
            return 2;
        }
        mt_config_cli_free(&cli);
        int rc = 0;
        if (rank == 0) {
            mt_model_t m = NULL;
            char from[1100] = "";
            mt_status_t st = mt_job_ckpt_read_model(ckpt, &m, NULL, from, sizeof(from));
            if (st == MT_OK && mt_model_config(m)->kind != MT_MODEL_GPT2) {
                st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s holds an MLP: only GPT-2 models have an llm.c format",
                              ckpt);
            }
            if (st == MT_OK) {
                st = mt_llmc_save(m, out);
            }
            if (st == MT_OK) {
                const mt_model_config_t *mc = mt_model_config(m);
                printf("meshtrain export: wrote %s from checkpoint %s (GPT-2 L=%d H=%d C=%d T=%d V=%d Vp=%d, %zu "
                       "parameters)\n",
                       out, from, mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len,
                       mc->vocab_size, mc->padded_vocab, mt_model_numel(m));
            } else {
                fprintf(stderr, "meshtrain export: %s\n", mt_last_error_msg());
                rc = st == MT_ERR_INVALID_ARG ? 2 : 1;
            }
            mt_model_free(m);
        }
        MPI_Bcast(&rc, 1, MPI_INT, 0, mt_rt_world()->comm);
        return rc;
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load_world(mt_rt_world()->comm, cli.path, cli.n_overrides, cli.overrides, &cfg);
    mt_config_cli_free(&cli);
    if (st != MT_OK) {
        return 2;
    }
    int rc = 0;
    if (rank == 0) {
        mt_model_config_t mc;
        mt_model_t m = NULL;
        st = mt_model_config_from(cfg, &mc);
        if (st == MT_OK && mc.kind != MT_MODEL_GPT2) {
            st = mt_error(MT_ERR_INVALID_ARG, "model.kind = mlp: only GPT-2 models have an llm.c format");
        }
        if (st == MT_OK) {
            st = mt_model_init(&mc, &m);
        }
        if (st == MT_OK) {
            st = mt_model_alloc_params(m);
        }
        if (st == MT_OK) {
            st = mt_model_init_from_config(m, cfg);
        }
        if (st == MT_OK) {
            st = mt_llmc_save(m, out);
        }
        if (st == MT_OK) {
            printf("meshtrain export: wrote %s (GPT-2 L=%d H=%d C=%d T=%d V=%d Vp=%d, %zu parameters)\n", out,
                   mc.n_layer, mc.n_head, mc.n_embd, mc.seq_len, mc.vocab_size, mt_model_config(m)->padded_vocab,
                   mt_model_numel(m));
        } else {
            fprintf(stderr, "meshtrain export: %s\n", mt_last_error_msg());
            rc = st == MT_ERR_INVALID_ARG ? 2 : 1;
        }
        mt_model_free(m);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, mt_rt_world()->comm);
    mt_config_free(cfg);
    return rc;
}
