/* backends/mpi/procs.h - the MPI processes under the `mpi` backend.
 *
 * The backend itself is reached by name (backends/registry.h, "mpi").  A
 * world of n ranks on it spans every process that mpiexec started: with P
 * processes each hosts R = n / P ranks (world rank = process * R + thread),
 * so n must be a multiple of P.  Programs that size their world from the
 * process count call par_mpi_procs first.
 */
#ifndef PAR_BACKENDS_MPI_PROCS_H
#define PAR_BACKENDS_MPI_PROCS_H

#include "core/status.h"

/* Initializes MPI the way the backend needs it (MPI_Init_thread asking
 * MPI_THREAD_SERIALIZED, finalized at exit) unless the program already did,
 * and gives the number of MPI processes and this process's index (either
 * pointer may be NULL).  Without mpiexec MPI starts as a singleton: 1
 * process. */
par_status par_mpi_procs(int *nprocs, int *proc);

#endif
