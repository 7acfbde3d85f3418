/* cli/devargs.h - the --device flag of run, golden and matrix (docs/gpu.md). */
#ifndef PAR_CLI_DEVARGS_H
#define PAR_CLI_DEVARGS_H

#include <stdio.h>

#define PAR_DEVICE_HELP                                                                     \
    "where the kernels run: cpu (default) or gpu (a build with -Doffload=nvptx; several "   \
    "ranks share a GPU, MPI processes take local rank mod the device count)"

/* --bitwise of golden, run and matrix (docs/bitwise.md). */
#define PAR_BITWISE_HELP                                                                    \
    "the bitwise mode: every gradient sum order-free (core/racc.h), so every layout gives "   \
    "the serial golden's bits (docs/bitwise.md; recorded in the manifest)"

/* --bitwise with --device gpu: 2 after the message (the device path has no
 * order-free accumulator), else 0. */
int par_cli_bitwise_device(const char *cmd, int bitwise, const char *device);

/* Selects the process's device from --device NAME (NULL = cpu).  0, or 2
 * after printing "parity CMD: <why>" to stderr (bad name, no offload in this
 * build, no device seen). */
int par_cli_device(const char *cmd, const char *name);
/* In GPU mode, one line "device: <what> (h2d ... MiB in N copies, d2h ...)". */
void par_cli_device_report(FILE *f);

#endif
