/* cli/autobackend.h - the backend a run gets when --backend is not given
 * (issue 33 item 1): OS threads while the world has few ranks per core,
 * fibers beyond (docs/comm.md "The default backend").  `parity run`,
 * `parity matrix` and its --cells files take it from here. */
#ifndef PAR_CLI_AUTOBACKEND_H
#define PAR_CLI_AUTOBACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

/* Ranks per core up to which OS threads are kept (threads' wall at most
 * fiber's there; tools/bench/backend-threshold.sh measured the crossing). */
#define PAR_AUTOBACKEND_THREADS_PER_CORE 4

/* The cores this process may run on (its CPU affinity; the online CPUs
 * when that cannot be read; at least 1). */
int par_autobackend_cores(void);

/* The backend for a world of `world` ranks on `cores` cores: "threads" or
 * "fiber" (threads when this build has no fiber backend); why (may be NULL)
 * receives the one-line reason printed with it. */
const char *par_autobackend_pick(int64_t world, int cores, char *why, size_t n);
/* The same on this process's cores, as a backend of the registry (the
 * matrix's per-cell rule, matrix/matrix.h pick_backend). */
const par_backend *par_autobackend_find(int64_t world, char *why, size_t n);

#endif
