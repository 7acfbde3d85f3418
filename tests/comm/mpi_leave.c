/* The end of an MPI job that spans hosts (issue 34, the cluster tier): a
 * process that leaves first must not get the others killed.  Run as
 *
 *   mpiexec -launcher fork -hosts ha:2,hb:2 -n 4 mpi_leave
 *
 * (two "hosts" on this machine, two processes each: hydra's MPI_LOCALNRANKS
 * < PMI_SIZE, so the backend ends without MPI_Finalize).  The odd processes
 * are slow to exit: a handler that runs after the backend's own exit handler
 * sleeps 1.5 s.  Hydra's proxy kills the other processes of its host when
 * one closes its PMI connection without PMI's finalize (and counts that one
 * as failed, exit status 1), so before the backend said finalize to PMI,
 * process 0's exit got process 1 killed in that sleep (mpiexec: BAD
 * TERMINATION); now every process passes PMI's barrier and says finalize
 * first: mpiexec exits 0.  Exit 0 here on success; the test is mpiexec's
 * status. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/mpi/procs.h"

static void slow_exit(void)
{
    struct timespec t = {1, 500000000L};
    nanosleep(&t, NULL);
    fprintf(stderr, "mpi_leave: process %s ends after its slow exit\n", getenv("PMI_RANK"));
}

int main(void)
{
    int n = 0, me = -1;
    const char *local = getenv("MPI_LOCALNRANKS"), *size = getenv("PMI_SIZE");
    if (!local || !size || atoi(local) >= atoi(size)) {
        fprintf(stderr, "mpi_leave: needs a job over two hosts (mpiexec -launcher fork -hosts ha:2,hb:2 -n 4)\n");
        return 2;
    }
    if (getenv("PMI_RANK") && atoi(getenv("PMI_RANK")) % 2)
        atexit(slow_exit); /* registered before the backend's: runs after it */
    if (par_mpi_procs(&n, &me) != PAR_OK || n != 4) {
        fprintf(stderr, "mpi_leave: MPI did not start 4 processes\n");
        return 1;
    }
    printf("mpi_leave: process %d of %d leaves\n", me, n);
    return 0;
}
