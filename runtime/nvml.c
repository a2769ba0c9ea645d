/* NVML through dlopen (see nvml.h). Only the few read-only entry points are resolved; the prototypes are
 * written here from NVML's documented ABI so nvml.h from the driver package is not needed to build.
 * SPDX-License-Identifier: MIT */
#include "nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

typedef int nvml_ret_t; /* nvmlReturn_t: 0 = NVML_SUCCESS */
typedef void *nvml_dev_t;

static struct {
    void *lib;
    int users;
    nvml_ret_t (*init)(void);
    nvml_ret_t (*shutdown)(void);
    const char *(*error_string)(nvml_ret_t);
    nvml_ret_t (*by_index)(unsigned, nvml_dev_t *);
    nvml_ret_t (*by_pci)(const char *, nvml_dev_t *);
    nvml_ret_t (*energy)(nvml_dev_t, unsigned long long *);
    nvml_ret_t (*power)(nvml_dev_t, unsigned *);
    nvml_ret_t (*name)(nvml_dev_t, char *, unsigned);
} nv;
static pthread_mutex_t nv_mu = PTHREAD_MUTEX_INITIALIZER;

struct mt_nvml {
    nvml_dev_t dev;
    char name[96];
};

MT_PARAM_STR(nvml_lib, "NVML_LIB", "libnvidia-ml.so.1")

static const char *nv_err(nvml_ret_t r) {
    return nv.error_string ? nv.error_string(r) : "?";
}

/* Loads the library and initialises NVML once per process user count. Lock held. */
static mt_status_t nv_load(void) {
    if (nv.users > 0) {
        nv.users++;
        return MT_OK;
    }
    const char *path = mt_param_nvml_lib();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        return mt_error(MT_ERR_SYSTEM, "nvml: cannot load %s (%s): no energy figures", path, dlerror());
    }
    struct {
        const char *sym;
        void **fn;
    } syms[] = {
        {"nvmlInit_v2", (void **)&nv.init},
        {"nvmlShutdown", (void **)&nv.shutdown},
        {"nvmlErrorString", (void **)&nv.error_string},
        {"nvmlDeviceGetHandleByIndex_v2", (void **)&nv.by_index},
        {"nvmlDeviceGetHandleByPciBusId_v2", (void **)&nv.by_pci},
        {"nvmlDeviceGetTotalEnergyConsumption", (void **)&nv.energy},
        {"nvmlDeviceGetPowerUsage", (void **)&nv.power},
        {"nvmlDeviceGetName", (void **)&nv.name},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(syms); i++) {
        *syms[i].fn = dlsym(lib, syms[i].sym);
        if (!*syms[i].fn) {
            dlclose(lib);
            memset(&nv, 0, sizeof(nv));
            return mt_error(MT_ERR_SYSTEM, "nvml: %s has no symbol %s", path, syms[i].sym);
        }
    }
    nvml_ret_t r = nv.init();
    if (r != 0) {
        mt_status_t st = mt_error(MT_ERR_INVALID_USAGE, "nvml: nvmlInit failed: %s (%d)", nv_err(r), r);
        dlclose(lib);
        memset(&nv, 0, sizeof(nv));
        return st;
    }
    nv.lib = lib;
    nv.users = 1;
    return MT_OK;
}

static void nv_unload(void) {
    if (--nv.users == 0) {
        nv.shutdown();
        dlclose(nv.lib);
        memset(&nv, 0, sizeof(nv));
    }
}

mt_status_t mt_nvml_open(const char *pci_bus_id, int index, mt_nvml_t *out) {
    *out = NULL;
    pthread_mutex_lock(&nv_mu);
    mt_status_t st = nv_load();
    if (st != MT_OK) {
        pthread_mutex_unlock(&nv_mu);
        return st;
    }
    nvml_dev_t dev = NULL;
    nvml_ret_t r = pci_bus_id ? nv.by_pci(pci_bus_id, &dev) : nv.by_index((unsigned)index, &dev);
    if (r != 0) {
        st = pci_bus_id ? mt_error(MT_ERR_INVALID_USAGE, "nvml: no device at PCI bus id %s: %s", pci_bus_id, nv_err(r))
                        : mt_error(MT_ERR_INVALID_USAGE, "nvml: no device %d: %s", index, nv_err(r));
        nv_unload();
        pthread_mutex_unlock(&nv_mu);
        return st;
    }
    struct mt_nvml *h = mt_calloc(sizeof(*h), MT_MEM_OTHER, "nvml");
    if (!h) {
        nv_unload();
        pthread_mutex_unlock(&nv_mu);
        return mt_error(MT_ERR_OOM, "nvml: no memory for a handle");
    }
    h->dev = dev;
    if (nv.name(dev, h->name, sizeof(h->name)) != 0) {
        strcpy(h->name, "?");
    }
    pthread_mutex_unlock(&nv_mu);
    *out = h;
    return MT_OK;
}

mt_status_t mt_nvml_energy_mj(mt_nvml_t h, uint64_t *mj) {
    unsigned long long v = 0;
    nvml_ret_t r = nv.energy(h->dev, &v);
    if (r != 0) {
        return mt_error(MT_ERR_INVALID_USAGE, "nvml: energy counter of %s unavailable: %s", h->name, nv_err(r));
    }
    *mj = v;
    return MT_OK;
}

mt_status_t mt_nvml_power_mw(mt_nvml_t h, unsigned *mw) {
    nvml_ret_t r = nv.power(h->dev, mw);
    if (r != 0) {
        return mt_error(MT_ERR_INVALID_USAGE, "nvml: power reading of %s unavailable: %s", h->name, nv_err(r));
    }
    return MT_OK;
}

const char *mt_nvml_device_name(mt_nvml_t h) {
    return h->name;
}

void mt_nvml_close(mt_nvml_t h) {
    if (!h) {
        return;
    }
    pthread_mutex_lock(&nv_mu);
    nv_unload();
    pthread_mutex_unlock(&nv_mu);
    mt_free(h);
}

void mt_energy_steps_init(mt_energy_steps_t *s, uint64_t mj, double t) {
    *s = (mt_energy_steps_t){.mj_change = mj, .t_last = t};
}

bool mt_energy_steps_update(mt_energy_steps_t *s, uint64_t mj, double t, double watts, double *joules) {
    double dt = t - s->t_last;
    s->t_last = t;
    s->steps++;
    if (mj < s->mj_change) { /* the counter was reset: count from the new reading */
        s->mj_change = mj;
        s->steps = 0;
    } else if (mj > s->mj_change) {
        s->per_step_j = (double)(mj - s->mj_change) * 1e-3 / s->steps;
        s->mj_change = mj;
        s->steps = 0;
        s->have = true;
    }
    if (s->have) {
        *joules = s->per_step_j;
        return true;
    }
    if (watts >= 0.0) {
        *joules = watts * dt;
        return true;
    }
    return false;
}

mt_status_t mt_nvml_meter_begin(mt_nvml_meter_t *m, mt_nvml_t h) {
    m->h = h;
    m->t0 = mt_now();
    return mt_nvml_energy_mj(h, &m->mj0);
}

mt_status_t mt_nvml_meter_end(mt_nvml_meter_t *m, double *joules, double *watts) {
    uint64_t mj = 0;
    MT_CHECK(mt_nvml_energy_mj(m->h, &mj));
    double dt = mt_now() - m->t0;
    *joules = (double)(mj - m->mj0) * 1e-3;
    if (watts) {
        *watts = dt > 0 ? *joules / dt : 0.0;
    }
    return MT_OK;
}
