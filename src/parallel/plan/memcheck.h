/* parallel/plan/memcheck.h - refuse a run before it allocates when the memory
 * model says it cannot fit (untemplated).
 *
 * The estimate of `parity run` / `parity golden` is the memory model of
 * parallel/plan/memmodel.h in parity's runtime (f64 / f32) for every rank this
 * process runs, plus what the run shares between its ranks: the global
 * batches of every step (driver.c: tokens and segments, int32 [steps, B, S];
 * samples per row, int64 [steps, B]; one par_batch [B, S]).  Two stages, so
 * that absurd sizes never build anything big: first a lower bound without
 * the parameter table (par_param_count: every parameter once as weight,
 * gradient and one optimizer slot, plus the shared batches); only when that
 * fits, the full per-rank model.  docs/planning.md, "Refusing a run".
 */
#ifndef PAR_PARALLEL_PLAN_MEMCHECK_H
#define PAR_PARALLEL_PLAN_MEMCHECK_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef struct {
    double rank_max;     /* the heaviest rank's M_peak (bytes)             */
    int rank_at;         /* which world rank                               */
    double ranks;        /* sum over the ranks this process runs           */
    double shared;       /* the run's shared buffers                       */
    double total;        /* ranks + shared                                 */
    int64_t nranks;      /* ranks this process runs                        */
    int bound_only;      /* 1: the lower bound already exceeded the limit  */
} par_memest;

/* The estimate of `parity run` with cfg (validated), the given layout
 * fields, precision 64 / 32, `steps` steps; `local` ranks in this process
 * (0: all of the world).  A layout that does not resolve gives PAR_EINVAL
 * (the run itself reports it).  limit > 0 lets the estimate stop at the
 * bound when that already exceeds it. */
par_status par_memcheck_run(const par_config *cfg, const par_layout *given, int precision, int64_t steps,
                            int64_t local, double limit, par_memest *out);
/* The serial golden run (world size 1). */
par_status par_memcheck_golden(const par_config *cfg, int precision, int64_t steps, double limit, par_memest *out);

/* The estimate of the serial golden over row blocks of `rows` rows (0 or
 * >= the batch: the one-shot golden's, par_memcheck_golden). */
par_status par_memcheck_golden_blocked(const par_config *cfg, int precision, int64_t steps, int64_t rows,
                                       par_memest *out);
/* The serial golden's row blocks (model/facade.h rows_per_block), the rule
 * of `parity golden` and of the matrix's serial references when no
 * --rows-per-block is given: *rows = 0 (one shot) when the one-shot
 * estimate is at most 80 % of limit (or limit <= 0); else, of R = ceil(B/2), ceil(B/4),
 * ..., 1, the first whose estimate is at most half the limit (a margin for
 * the estimate: smaller blocks cost little time), else the largest that
 * fits; R = 1 when none fits (its estimate in *out: the caller's
 * par_memcheck_fits refuses it).  A blocked estimate is the one-shot golden
 * of R rows plus what the blocked step holds for all B rows (its step file's
 * tensors, the statistics of B rows, the shared batches of B rows). */
par_status par_memcheck_golden_rows(const par_config *cfg, int precision, int64_t steps, double limit,
                                    int64_t *rows, par_memest *out);

/* This machine's physical memory in bytes (sysconf; /proc/meminfo's
 * MemTotal when sysconf cannot say), 0 when unknown. */
double par_memcheck_machine(void);

/* PAR_EINVAL naming the estimate and the limit in bytes when e->total >
 * limit ("what" names the run and where the limit came from). */
par_status par_memcheck_fits(const par_memest *e, double limit, const char *what);

#endif
