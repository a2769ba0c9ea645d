/* GPU energy and power through NVML, loaded at run time with dlopen so neither the build nor a CPU-only
 * machine needs NVML. Read-only by design: meshtrain never changes clocks, power limits or any other
 * device setting; only the energy counter and the power draw are read.
 * SPDX-License-Identifier: MIT */
#ifndef MT_NVML_H
#define MT_NVML_H

#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_nvml *mt_nvml_t;

/* Opens the GPU with PCI bus id pci_bus_id ("0000:17:00.0", as cudaDeviceGetPCIBusId writes it), or the
 * NVML device of index `index` when pci_bus_id is NULL. The library is MESHTRAIN_NVML_LIB (default
 * libnvidia-ml.so.1). Errors (the caller then reports no energy): MT_ERR_SYSTEM when the library cannot
 * be loaded or lacks a symbol, MT_ERR_INVALID_USAGE when NVML does not initialise or the device is not
 * found; the message names which. */
mt_status_t mt_nvml_open(const char *pci_bus_id, int index, mt_nvml_t *out);

/* Energy used by the GPU since the driver loaded, in millijoules (Volta and newer). MT_ERR_INVALID_USAGE
 * when the device does not support the counter. */
mt_status_t mt_nvml_energy_mj(mt_nvml_t h, uint64_t *mj);

/* Current power draw in milliwatts. */
mt_status_t mt_nvml_power_mw(mt_nvml_t h, unsigned *mw);

/* The device name NVML reports ("NVIDIA H200"). */
const char *mt_nvml_device_name(mt_nvml_t h);

/* Closes (nvmlShutdown when the last handle goes). NULL is a no-op. */
void mt_nvml_close(mt_nvml_t h);

/* A step's energy: begin reads the counter, end returns joules since begin (and *watts, the mean power
 * over wall seconds dt, when watts is non-NULL). */
typedef struct {
    mt_nvml_t h;
    uint64_t mj0;
    double t0;
} mt_nvml_meter_t;
mt_status_t mt_nvml_meter_begin(mt_nvml_meter_t *m, mt_nvml_t h);
mt_status_t mt_nvml_meter_end(mt_nvml_meter_t *m, double *joules, double *watts);

/* Per-step energy from a counter that updates more coarsely than a step. Seen on an H200 (driver 580, steps of
 * 40 ms): successive reads of the total-energy counter were often equal, so differences per step alternated
 * between 0 and about twice the step's energy. Here each change of the counter is spread evenly over the steps
 * since its previous change, and a step ending before the next change reports that last per-step figure.
 * Before the counter first changes, a step's figure is the power draw times its wall time (watts < 0: no power
 * reading, and update returns false: the step carries no energy). t: seconds on any steady clock. Pure
 * arithmetic on the readings (tests/runtime/test_energy_steps.c). */
typedef struct {
    uint64_t mj_change; /* the counter at its last change */
    int steps;          /* steps ended since then */
    double per_step_j;
    bool have;     /* the counter has changed at least once */
    double t_last; /* the previous update's (or init's) time */
} mt_energy_steps_t;
void mt_energy_steps_init(mt_energy_steps_t *s, uint64_t mj, double t);
bool mt_energy_steps_update(mt_energy_steps_t *s, uint64_t mj, double t, double watts, double *joules);

#ifdef __cplusplus
}
#endif
#endif /* MT_NVML_H */
