/* cli/memlimit.h - `--max-memory SIZE` of `parity run` / `parity golden`:
 * before anything is allocated, the run's memory estimate
 * (parallel/plan/memcheck.h) against min(this machine's memory, SIZE); a run
 * that cannot fit is refused with exit 2 and the estimate in bytes. */
#ifndef PAR_CLI_MEMLIMIT_H
#define PAR_CLI_MEMLIMIT_H

#include <stdint.h>

#include "model/config.h"
#include "parallel/layout/layout.h"

#define PAR_MEMLIMIT_HELP "refuse a run the memory model says needs more than SIZE (e.g. 16GB; default: this machine's memory)"

/* The limit: min(this machine's memory, SIZE) in bytes, and its words
 * ("--max-memory 16GB" or "this machine's memory") in what[n]; -1 and a
 * message on stderr for a bad SIZE. */
double par_memlimit_limit(const char *cmd, const char *max_memory, char *what, size_t n);

/* 0: go on (also when the layout does not resolve: the run reports that);
 * 2: refused or a bad SIZE, one message on stderr.  local: ranks of this
 * process (0: the whole world). */
int par_memlimit_run(const char *cmd, const char *max_memory, const par_config *cfg, const par_layout *l,
                     int precision, int64_t steps, int64_t local);
int par_memlimit_golden(const char *cmd, const char *max_memory, const par_config *cfg, int precision,
                        int64_t steps);

/* The same for `parity golden` and its row blocks: *rows > 0 (--rows-per-block)
 * checks the golden over those blocks; *rows == 0 applies the automatic rule
 * (parallel/plan/memcheck.h par_memcheck_golden_rows: one shot when it fits,
 * else the largest halving of the batch that does, said on stderr) and sets
 * *rows (0: one shot). */
int par_memlimit_golden_rows(const char *cmd, const char *max_memory, const par_config *cfg, int precision,
                             int64_t steps, int64_t *rows);

#endif
