/* Private to the MPI backend: the user-defined f16/bf16 reductions (coll_mpi_redop.c).
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_MPI_H
#define MT_COLL_MPI_H

#include "collectives/coll_backend.h"

/* Creates the f16/bf16 MPI_Ops once per process (MPI must be initialised). Returns an MPI code. */
int mt_coll_mpi_redop_init(void);
/* The MPI_Op for a 16-bit float dtype and a reduction (AVG -> the sum; the caller divides). */
MPI_Op mt_coll_mpi_op16(mt_coll_dtype_t dtype, mt_redop_t op);

#endif
