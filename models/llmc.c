/* llm.c checkpoint import/export (see llmc.h for the format). Every size is validated against the
 * file's length before anything is read, so a malformed file never makes us allocate or read garbage.
 * SPDX-License-Identifier: MIT */
#include "models/llmc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* llm.c's tensors in file order; per-layer kinds map to our "h.%d.<suffix>". */
static const char *const kinds[16] = {
    "wte",
    "wpe",
    "ln_1.weight",
    "ln_1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.fc.weight",
    "mlp.fc.bias",
    "mlp.proj.weight",
    "mlp.proj.bias",
    "ln_f.weight",
    "ln_f.bias",
};
static bool per_layer(int k) {
    return k >= 2 && k <= 13;
}

static int64_t expected_floats(const mt_llmc_header_t *h) {
    int64_t C = h->channels, L = h->n_layer;
    return (int64_t)h->padded_vocab * C + (int64_t)h->max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

mt_status_t mt_llmc_read_header(const char *path, mt_llmc_header_t *h) {
    memset(h, 0, sizeof(*h));
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mt_error(MT_ERR_IO, "llm.c checkpoint %s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    int sr = fstat(fileno(f), &sb);
    if (sr == 0 && !S_ISREG(sb.st_mode)) {
        fclose(f);
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: not a regular file (%s)", path,
                        S_ISDIR(sb.st_mode) ? "a directory" : "a device, pipe or socket");
    }
    int32_t hd[256];
    size_t got = fread(hd, sizeof(int32_t), 256, f);
    fclose(f);
    if (got != 256) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: truncated header (%zu of 1024 bytes)", path,
                        got * sizeof(int32_t));
    }
    if (sr != 0) {
        return mt_error(MT_ERR_IO, "llm.c checkpoint %s: cannot stat: %s", path, strerror(errno));
    }
    if (hd[0] != MT_LLMC_MAGIC) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: bad magic %d (expected %d): not a GPT-2 model file",
                        path, hd[0], MT_LLMC_MAGIC);
    }
    if (hd[1] != MT_LLMC_VERSION_FP32) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "llm.c checkpoint %s: version %d unsupported (only %d = fp32; version 5 is bf16: export fp32)",
                        path, hd[1], MT_LLMC_VERSION_FP32);
    }
    h->max_seq_len = hd[2];
    h->vocab_size = hd[3];
    h->n_layer = hd[4];
    h->n_head = hd[5];
    h->channels = hd[6];
    h->padded_vocab = hd[7];
    struct {
        const char *name;
        int v, lo, hi;
    } checks[] = {
        {"max_seq_len", h->max_seq_len, 1, 1 << 20},
        {"vocab_size", h->vocab_size, 2, 1 << 24},
        {"n_layer", h->n_layer, 1, 1024},
        {"n_head", h->n_head, 1, 1024},
        {"channels", h->channels, 1, 65536},
        {"padded_vocab_size", h->padded_vocab, 2, 1 << 25},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(checks); i++) {
        if (checks[i].v < checks[i].lo || checks[i].v > checks[i].hi) {
            return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: %s = %d is outside [%d, %d]", path,
                            checks[i].name, checks[i].v, checks[i].lo, checks[i].hi);
        }
    }
    if (h->padded_vocab < h->vocab_size) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: padded_vocab_size %d < vocab_size %d", path,
                        h->padded_vocab, h->vocab_size);
    }
    if (h->channels % h->n_head != 0) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: channels %d is not a multiple of n_head %d", path,
                        h->channels, h->n_head);
    }
    h->n_floats = expected_floats(h); /* bounded above by ~2^62 given the ranges: no overflow */
    int64_t want = 1024 + 4 * h->n_floats;
    if ((int64_t)sb.st_size < want) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: truncated: %lld bytes, the header implies %lld", path,
                        (long long)sb.st_size, (long long)want);
    }
    if ((int64_t)sb.st_size > want) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "llm.c checkpoint %s: %lld bytes, the header implies %lld: trailing bytes (wrong dtype?)", path,
                        (long long)sb.st_size, (long long)want);
    }
    return MT_OK;
}

mt_status_t mt_llmc_apply_header(const mt_llmc_header_t *h, const char *path, unsigned explicit_mask,
                                 mt_model_config_t *cfg) {
    struct {
        unsigned bit;
        const char *key, *hname;
        int *field;
        int hv;
    } f[] = {
        {MT_LLMC_SET_N_LAYER, "model.n_layer", "n_layer", &cfg->n_layer, h->n_layer},
        {MT_LLMC_SET_N_HEAD, "model.n_head", "n_head", &cfg->n_head, h->n_head},
        {MT_LLMC_SET_N_EMBD, "model.n_embd", "channels", &cfg->n_embd, h->channels},
        {MT_LLMC_SET_SEQ_LEN, "model.seq_len", "max_seq_len", &cfg->seq_len, h->max_seq_len},
        {MT_LLMC_SET_VOCAB, "model.vocab_size", "vocab_size", &cfg->vocab_size, h->vocab_size},
        {MT_LLMC_SET_PADDED_VOCAB, "model.padded_vocab", "padded_vocab_size", &cfg->padded_vocab, h->padded_vocab},
    };
    if (cfg->kind != MT_MODEL_GPT2) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s holds a GPT-2 model but model.kind is not gpt2", path);
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(f); i++) {
        if ((explicit_mask & f[i].bit) && *f[i].field != f[i].hv) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "%s = %d contradicts the checkpoint's %s = %d (%s); remove it or match it", f[i].key,
                            *f[i].field, f[i].hname, f[i].hv, path);
        }
        *f[i].field = f[i].hv;
    }
    return MT_OK;
}

static mt_status_t check_model(mt_model_t m, const mt_llmc_header_t *h, const char *path) {
    const mt_model_config_t *c = mt_model_config(m);
    if (c->kind != MT_MODEL_GPT2 || c->tp_size != 1) {
        return mt_error(MT_ERR_INVALID_USAGE, "llm.c checkpoint %s: needs a whole (tp_size 1) GPT-2 model", path);
    }
    struct {
        const char *name;
        int model, file;
    } f[] = {
        {"n_layer", c->n_layer, h->n_layer},          {"n_head", c->n_head, h->n_head},
        {"n_embd/channels", c->n_embd, h->channels},  {"seq_len/max_seq_len", c->seq_len, h->max_seq_len},
        {"vocab_size", c->vocab_size, h->vocab_size}, {"padded_vocab", c->padded_vocab, h->padded_vocab},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(f); i++) {
        if (f[i].model != f[i].file) {
            return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: model %s = %d but the checkpoint has %d", path,
                            f[i].name, f[i].model, f[i].file);
        }
    }
    for (int i = 0; i < mt_model_n_params(m); i++) {
        if (!mt_model_param(m, i)->data) {
            return mt_error(MT_ERR_INVALID_ARG, "llm.c checkpoint %s: parameter %s has no data bound", path,
                            mt_model_param(m, i)->name);
        }
    }
    return MT_OK;
}

static mt_param_t *kind_param(mt_model_t m, int k, int l) {
    char name[MT_PARAM_NAME_MAX];
    if (per_layer(k)) {
        snprintf(name, sizeof(name), "h.%d.%s", l, kinds[k]);
    } else {
        snprintf(name, sizeof(name), "%s", kinds[k]);
    }
    int i = mt_model_find_param(m, name);
    MT_ASSERT(i >= 0);
    return mt_model_param(m, i);
}

mt_status_t mt_llmc_load(mt_model_t m, const char *path) {
    mt_llmc_header_t h;
    MT_CHECK(mt_llmc_read_header(path, &h));
    MT_CHECK(check_model(m, &h, path));
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mt_error(MT_ERR_IO, "llm.c checkpoint %s: cannot open: %s", path, strerror(errno));
    }
    mt_status_t st = MT_OK;
    if (fseek(f, 1024, SEEK_SET) != 0) {
        st = mt_error(MT_ERR_IO, "llm.c checkpoint %s: seek failed: %s", path, strerror(errno));
    }
    for (int k = 0; k < 16 && st == MT_OK; k++) {
        for (int l = 0; l < (per_layer(k) ? h.n_layer : 1) && st == MT_OK; l++) {
            mt_param_t *p = kind_param(m, k, l);
            if (fread(p->data, sizeof(float), p->numel, f) != p->numel) {
                st = mt_error(MT_ERR_IO, "llm.c checkpoint %s: short read in %s", path, p->name);
            }
        }
    }
    fclose(f);
    if (st == MT_OK) {
        MT_INFO(MT_LOG_MODEL, "loaded llm.c checkpoint %s (%lld parameters)", path, (long long)h.n_floats);
    }
    return st;
}

mt_status_t mt_llmc_save(mt_model_t m, const char *path) {
    const mt_model_config_t *c = mt_model_config(m);
    mt_llmc_header_t h = {.max_seq_len = c->seq_len,
                          .vocab_size = c->vocab_size,
                          .n_layer = c->n_layer,
                          .n_head = c->n_head,
                          .channels = c->n_embd,
                          .padded_vocab = c->padded_vocab};
    MT_CHECK(check_model(m, &h, path));
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
        return mt_error(MT_ERR_INVALID_ARG, "llm.c export: path too long: %s", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        return mt_error(MT_ERR_IO, "llm.c export: cannot create %s: %s", tmp, strerror(errno));
    }
    int32_t hd[256] = {MT_LLMC_MAGIC, MT_LLMC_VERSION_FP32, h.max_seq_len, h.vocab_size, h.n_layer,
                       h.n_head,      h.channels,           h.padded_vocab};
    bool ok = fwrite(hd, sizeof(int32_t), 256, f) == 256;
    for (int k = 0; k < 16 && ok; k++) {
        for (int l = 0; l < (per_layer(k) ? h.n_layer : 1) && ok; l++) {
            mt_param_t *p = kind_param(m, k, l);
            ok = fwrite(p->data, sizeof(float), p->numel, f) == p->numel;
        }
    }
    int e = errno;
    if (fclose(f) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok || rename(tmp, path) != 0) {
        e = ok ? errno : e;
        remove(tmp);
        return mt_error(MT_ERR_IO, "llm.c export: writing %s failed: %s", path, strerror(e));
    }
    return MT_OK;
}
