/* cli/matrix_mpi.h - `parity matrix --backend mpi`: the layout runner that
 * runs each layout job as its own MPI job,
 *
 *   mpiexec -n P parity run --backend mpi --ranks-per-process N/P
 *           --world-size N --preset ... <the cell's flags> --topology reference
 *           --quiet --summary WORK/TAG-summary.json [--dump/--save/--load]
 *
 * (P: the largest divisor of N that is at most mpi_procs; N/P thread ranks
 * per process above that), its output into WORK/TAG.log, and hands back
 * the run's JSON summary (parallel/train/run_summary.h).  The matrix process
 * itself never initializes MPI: a cell that crashes or hangs its MPI job
 * fails alone, with the last lines of its log.
 */
#ifndef PAR_CLI_MATRIX_MPI_H
#define PAR_CLI_MATRIX_MPI_H

#include "matrix/matrix.h"

typedef struct {
    const char *mpiexec;  /* the launcher (NULL: "mpiexec") */
    const char *self_exe; /* the parity binary (NULL: /proc/self/exe) */
    int mpi_procs;        /* at most this many processes per job (0: 8) */
} par_mpi_runner;

/* A par_layout_runner; ud is a par_mpi_runner *. */
par_status par_mpi_run_layout(const par_layout_job *job, void *ud, cJSON **summary);

#endif
